"""Search spaces of tunable parameters: the :class:`Tune` marker a plugin puts next to a
parameter in its signature (``lr: Annotated[float, Field(gt=0), Tune.log_uniform(1e-4, 1e-1)]
= 5e-4``), how a spec writes one (``{log_uniform: [1e-4, 1e-1]}``, :meth:`Tune.parse`), and
:func:`declared_space`, the space a parameter model declares. Part of the contract: plugins
import :class:`Tune` from ``selbench``; the tuning procedure itself is the core's
(:mod:`selbench.execution.tuning`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

__all__ = ["DISTRIBUTIONS", "SearchError", "Tune", "declared_space"]

#: The distributions a space may use, as a spec writes them (one key per parameter).
DISTRIBUTIONS = ("log_uniform", "uniform", "int", "choice")


class SearchError(ValueError):
    """A search space is malformed (the message says what and where)."""


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SearchError(f"{what}: expected a finite number, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class Tune:
    """One parameter's search space: ``log_uniform`` / ``uniform`` floats in ``[low, high]``,
    ``int`` integers in ``[low, high]`` (inclusive), or a ``choice`` among JSON values.

    Build it with :meth:`log_uniform`, :meth:`uniform`, :meth:`int` or :meth:`choice`; put it
    in the parameter's ``Annotated[...]`` metadata to declare the plugin's default space.
    """

    dist: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()

    @classmethod
    def log_uniform(cls, low: float, high: float) -> Tune:
        """Floats log-uniformly in ``[low, high]``, ``0 < low < high``."""
        return cls._range("log_uniform", low, high)

    @classmethod
    def uniform(cls, low: float, high: float) -> Tune:
        """Floats uniformly in ``[low, high]``, ``low < high``."""
        return cls._range("uniform", low, high)

    @classmethod
    def int(cls, low: float, high: float) -> Tune:  # (builtins.int stays visible in methods)
        """Integers in ``[low, high]`` (both included)."""
        return cls._range("int", low, high)

    @classmethod
    def choice(cls, *options: Any) -> Tune:
        """One of ``options`` (numbers, strings, booleans, lists of them; at least two)."""
        if len(options) < 2:
            raise SearchError(f"choice: give at least two options, got {list(options)!r}")
        keys = [json.dumps(o, sort_keys=True) for o in options]
        if len(set(keys)) != len(keys):
            raise SearchError(f"choice: options listed twice in {list(options)!r}")
        return cls("choice", choices=tuple(json.loads(k) for k in keys))

    @classmethod
    def _range(cls, dist: str, low: Any, high: Any) -> Tune:
        lo, hi = _number(low, f"{dist} low"), _number(high, f"{dist} high")
        if dist == "int" and (lo != int(lo) or hi != int(hi)):
            raise SearchError(f"int: bounds must be integers, got [{low!r}, {high!r}]")
        if not lo < hi:
            raise SearchError(f"{dist}: expected low < high, got [{low!r}, {high!r}]")
        if dist == "log_uniform" and lo <= 0:
            raise SearchError(f"log_uniform: low must be > 0, got {low!r}")
        if dist == "int":
            return cls(dist, int(lo), int(hi))
        return cls(dist, lo, hi)

    @classmethod
    def parse(cls, value: Any) -> Tune:
        """A space as a spec writes it: ``{log_uniform: [lo, hi]}``, ``{uniform: [lo, hi]}``,
        ``{int: [lo, hi]}`` or ``{choice: [a, b, ...]}``; :class:`SearchError` otherwise."""
        if isinstance(value, Tune):
            return value
        if not isinstance(value, dict) or len(value) != 1:
            raise SearchError(f"expected one of {{{': ..., '.join(DISTRIBUTIONS)}: ...}}, "
                              f"got {value!r}")
        (dist, args), = value.items()
        if dist not in DISTRIBUTIONS:
            raise SearchError(f"unknown distribution {dist!r}; use one of "
                              f"{', '.join(DISTRIBUTIONS)}")
        if not isinstance(args, list):
            raise SearchError(f"{dist}: expected a list, got {args!r}")
        if dist == "choice":
            return cls.choice(*args)
        if len(args) != 2:
            raise SearchError(f"{dist}: expected [low, high], got {args!r}")
        return cls._range(dist, *args)

    def to_json(self) -> dict[str, list[Any]]:
        """The spec form (what :meth:`parse` reads)."""
        if self.dist == "choice":
            return {"choice": list(self.choices)}
        return {self.dist: [self.low, self.high]}

    def corners(self) -> list[Any]:
        """The values a parameter model must accept for every sample to be valid: the bounds,
        or every choice."""
        return list(self.choices) if self.dist == "choice" else [self.low, self.high]

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is a point of this space."""
        if self.dist == "choice":
            return json.dumps(value, sort_keys=True) in {json.dumps(c, sort_keys=True)
                                                        for c in self.choices}
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.dist == "int" and value != int(value):
            return False
        return self.low <= value <= self.high

    def describe(self) -> str:
        """Short form for listings: ``log[0.0001, 0.1]``, ``int[5, 30]``, ``{[64], [128, 128]}``."""
        if self.dist == "choice":
            return "{" + ", ".join(json.dumps(c) for c in self.choices) + "}"
        short = {"log_uniform": "log", "uniform": "", "int": "int"}[self.dist]
        return f"{short}[{self.low:g}, {self.high:g}]"


def declared_space(model: type[BaseModel]) -> dict[str, Tune]:
    """Parameter name -> :class:`Tune` for every parameter of ``model`` that declares one."""
    out: dict[str, Tune] = {}
    for name, info in model.model_fields.items():
        tune = next((m for m in info.metadata if isinstance(m, Tune)), None)
        if tune is not None:
            out[name] = tune
    return out
