"""Experiment specs: YAML files validated by pydantic, then against each plugin's own model.

A spec names every component as ``{name, params}``. Validation happens in two passes:

1. the spec's structure (:class:`Spec`, ``extra="forbid"`` everywhere);
2. after plugin discovery, each component's ``name`` must exist for its kind and its
   ``params`` must validate against that plugin's pydantic model.

Every problem is reported as one line naming the YAML path, e.g.
``experiments[1].methods[3].recalibrator.params.lr: Input should be a valid number``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from selbench.api import CoverageLoss, SelectionLoss
from selbench.inputs import InputSpec, check_exists, declared_inputs, resolve_path
from selbench.metrics import DEFAULT_BETAS
from selbench.plugins import PluginError, Registry, format_validation_error, get_registry

__all__ = [
    "SPEC_VERSION",
    "Component",
    "ExperimentSpec",
    "GuaranteeSpec",
    "MethodSpec",
    "ResolvedSpec",
    "Spec",
    "SpecError",
    "apply_overrides",
    "load_spec",
]

SPEC_VERSION = 1


class SpecError(ValueError):
    """A spec is malformed; ``errors`` holds one ``path: message`` line per problem."""

    def __init__(self, errors: list[str], source: str | None = None):
        self.errors = list(errors)
        self.source = source
        head = f"invalid spec {source}" if source else "invalid spec"
        super().__init__(head + ":\n" + "\n".join("  " + e for e in self.errors))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Component(_Model):
    """A plugin reference: its registered ``name`` and the ``params`` for its factory."""

    name: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


class MethodSpec(_Model):
    """One leaderboard row: a scheme applied to a selector and a recalibrator."""

    label: str = Field(min_length=1, description="row name in the leaderboard")
    scheme: Component
    selector: Component = Field(default_factory=lambda: Component(name="none"))
    recalibrator: Component = Field(default_factory=lambda: Component(name="none"))
    loss: Component | None = Field(default=None, description="selective loss (trained schemes)")
    coverage: Component | None = Field(default=None, description="coverage loss (trained schemes)")


class GuaranteeSpec(_Model):
    """Hoeffding-guaranteed coverage: lower τ until coverage − ε ≥ β with prob. 1 − δ."""

    delta: float = Field(gt=0.0, lt=1.0)


class ExperimentSpec(_Model):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    dataset: Component
    backbone: Component
    fit_split: str = Field(description="labelled split the methods are fitted on")
    eval_split: str = Field(description="target split the methods are evaluated on")
    n_fit: int | None = Field(default=None, gt=0, description="fitting examples drawn per seed")
    n_eval: int | None = Field(
        default=None, gt=0, description="evaluation examples (a fixed seeded sample)"
    )
    betas: list[float] = Field(default_factory=lambda: [float(b) for b in DEFAULT_BETAS])
    train_beta: float | Literal["per_beta"] = Field(
        default=0.5,
        description="coverage the selectors are trained for, or per_beta for one model per β",
    )
    report: Literal["auc", "betas"] = "auc"
    coverage_guarantee: GuaranteeSpec | None = None
    methods: list[MethodSpec] = Field(min_length=1)

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("at least one coverage level is needed")
        if any(not (0.0 < b <= 1.0) for b in v):
            raise ValueError("every coverage level must lie in (0, 1]")
        if sorted(set(v)) != list(v):
            raise ValueError("coverage levels must be strictly increasing")
        return v

    @field_validator("train_beta")
    @classmethod
    def _train_beta(cls, v: float | str) -> float | str:
        if isinstance(v, float) and not (0.0 < v <= 1.0):
            raise ValueError("train_beta must lie in (0, 1] or be 'per_beta'")
        return v

    @model_validator(mode="after")
    def _unique_labels(self) -> ExperimentSpec:
        seen: set[str] = set()
        for m in self.methods:
            if m.label in seen:
                raise ValueError(f"method label {m.label!r} is used twice")
            seen.add(m.label)
        return self


class Spec(_Model):
    spec_version: Literal[1]
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    description: str = ""
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    experiments: list[ExperimentSpec] = Field(min_length=1)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("seeds must be distinct")
        return v

    @model_validator(mode="after")
    def _unique_names(self) -> Spec:
        names = [e.name for e in self.experiments]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"experiment names must be unique, repeated: {sorted(dup)}")
        return self


class ResolvedSpec:
    """A validated spec with every plugin found and every ``params`` validated."""

    def __init__(
        self,
        spec: Spec,
        registry: Registry,
        raw: dict,
        source: str | None,
        base_dir: str | Path | None = None,
    ):
        self.spec = spec
        self.registry = registry
        self.raw = raw
        self.source = source
        #: relative input paths resolve against this folder: the spec file's (cwd for dicts)
        self.base_dir = Path(base_dir) if base_dir is not None else (
            Path(source).resolve().parent if source is not None else Path.cwd()
        )

    def canonical(self) -> dict:
        """The spec with defaults filled in (plugin params included), JSON-ready."""
        data = self.spec.model_dump(mode="json")
        for e_i, exp in enumerate(self.spec.experiments):
            d = data["experiments"][e_i]
            d["dataset"]["params"] = self.params("dataset", exp.dataset)
            d["backbone"]["params"] = self.params("backbone", exp.backbone)
            for m_i, m in enumerate(exp.methods):
                dm = d["methods"][m_i]
                for kind, field in _METHOD_FIELDS:
                    comp = getattr(m, field)
                    if comp is not None:
                        dm[field]["params"] = self.params(kind, comp)
        return data

    def params(self, kind: str, comp: Component) -> dict:
        """Validated params with defaults filled in and declared input paths resolved
        against :attr:`base_dir` (see :mod:`selbench.inputs`)."""
        reg = self.registry.get(kind, comp.name)
        params = reg.validate_params(comp.params).model_dump(mode="json")
        for field, _ in declared_inputs(reg.plugin.params).items():
            if isinstance(params.get(field), str):
                params[field] = resolve_path(params[field], self.base_dir)
        return params

    def inputs(self, kind: str, comp: Component) -> dict[str, tuple[str, InputSpec]]:
        """Parameter -> (resolved path, declaration) for every input ``comp`` names."""
        reg = self.registry.get(kind, comp.name)
        params = self.params(kind, comp)
        return {
            field: (params[field], spec)
            for field, spec in declared_inputs(reg.plugin.params).items()
            if isinstance(params.get(field), str)
        }

    def build(self, kind: str, comp: Component) -> Any:
        return self.registry.get(kind, comp.name).build(self.params(kind, comp))

    def hash(self) -> str:
        return content_hash(self.canonical())


_METHOD_FIELDS = (
    ("scheme", "scheme"),
    ("selector", "selector"),
    ("recalibrator", "recalibrator"),
    ("loss", "loss"),
    ("loss", "coverage"),
)


def content_hash(obj: Any) -> str:
    """SHA-256 of the canonical JSON form of ``obj``."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


# --------------------------------------------------------------------------- loading
def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise SpecError([f"{path}: no such file"], str(path))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError([f"<yaml>{where}: {problem}"], str(path)) from None
    if not isinstance(data, dict):
        raise SpecError(["<root>: a spec is a YAML mapping with spec_version, name, ..."], str(path))
    return data


_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _parse_path(path: str) -> list[str | int]:
    parts: list[str | int] = []
    pos = 0
    for m in _TOKEN.finditer(path):
        if m.start() != pos and path[pos:m.start()] != ".":
            raise ValueError(f"cannot parse key path {path!r}")
        parts.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    if pos != len(path) or not parts:
        raise ValueError(f"cannot parse key path {path!r}")
    return parts


def apply_overrides(data: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Apply ``key.path=value`` overrides (value parsed as YAML) to a raw spec dict.

    Paths use dots and ``[i]`` indices; inside a list of experiments or methods an element
    may also be named: ``experiments.digits-shift.n_fit=200`` or
    ``experiments[0].methods.Temp.scheme.params.lr=0.01``.
    """
    data = copy.deepcopy(data)
    errors = []
    for item in overrides:
        if "=" not in item:
            errors.append(f"--set {item}: expected key=value")
            continue
        key, _, value = item.partition("=")
        try:
            parts = _parse_path(key.strip())
            parsed = yaml.safe_load(value) if value.strip() else ""
        except (ValueError, yaml.YAMLError) as exc:
            errors.append(f"--set {item}: {exc}")
            continue
        node: Any = data
        ok = True
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                idx = part if isinstance(part, int) else _find_named(node, part)
                if idx is None or not (0 <= idx < len(node)):
                    errors.append(f"--set {item}: no element {part!r} at {_fmt(parts[:i])}")
                    ok = False
                    break
                if last:
                    node[idx] = parsed
                else:
                    node = node[idx]
            elif isinstance(node, dict):
                if isinstance(part, int):
                    errors.append(f"--set {item}: {_fmt(parts[:i])} is not a list")
                    ok = False
                    break
                if last:
                    node[part] = parsed
                else:
                    node = node.setdefault(part, {})
            else:
                errors.append(f"--set {item}: {_fmt(parts[:i])} is not a mapping or list")
                ok = False
                break
        del ok
    if errors:
        raise SpecError(errors, "--set")
    return data


def _find_named(items: list, name: str) -> int | None:
    for i, el in enumerate(items):
        if isinstance(el, dict) and (el.get("name") == name or el.get("label") == name):
            return i
    return None


def _fmt(parts: list[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "<root>"


def load_spec(
    source: str | Path | dict,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    registry: Registry | None = None,
) -> ResolvedSpec:
    """Read, validate and resolve a spec (path or dict); raises :class:`SpecError`."""
    label = None if isinstance(source, dict) else str(source)
    raw = copy.deepcopy(source) if isinstance(source, dict) else read_yaml(source)
    if overrides:
        raw = apply_overrides(raw, overrides)
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, ""), label) from None
    registry = registry or get_registry()
    errors: list[str] = []
    for e_i, exp in enumerate(spec.experiments):
        base = f"experiments[{e_i}]"
        _check(registry, "dataset", exp.dataset, f"{base}.dataset", errors)
        _check(registry, "backbone", exp.backbone, f"{base}.backbone", errors)
        for m_i, m in enumerate(exp.methods):
            mbase = f"{base}.methods[{m_i}]"
            for kind, field in _METHOD_FIELDS:
                comp = getattr(m, field)
                if comp is None:
                    continue
                reg = _check(registry, kind, comp, f"{mbase}.{field}", errors)
                if reg is not None and field in ("loss", "coverage"):
                    want = SelectionLoss if field == "loss" else CoverageLoss
                    factory = reg.plugin.factory
                    if isinstance(factory, type) and not issubclass(factory, want):
                        errors.append(
                            f"{mbase}.{field}.name: {comp.name!r} is a "
                            f"{'coverage' if field == 'loss' else 'selection'} loss; "
                            f"`{field}` expects a {want.__name__}"
                        )
    if errors:
        raise SpecError(errors, label)
    resolved = ResolvedSpec(spec, registry, raw, label)
    for e_i, exp in enumerate(spec.experiments):
        base = f"experiments[{e_i}]"
        comps = [("dataset", "dataset", exp.dataset), ("backbone", "backbone", exp.backbone)]
        for m_i, m in enumerate(exp.methods):
            comps += [(kind, f"methods[{m_i}].{field}", getattr(m, field))
                      for kind, field in _METHOD_FIELDS if getattr(m, field) is not None]
        for kind, where, comp in comps:
            for pname, (path, ispec) in resolved.inputs(kind, comp).items():
                problem = check_exists(path, ispec)
                if problem is not None and (ispec.must_exist or Path(path).exists()):
                    errors.append(f"{base}.{where}.params.{pname}: {problem}")
    if errors:
        raise SpecError(sorted(set(errors), key=errors.index), label)
    return resolved


def _check(registry: Registry, kind: str, comp: Component, path: str, errors: list[str]):
    try:
        reg = registry.get(kind, comp.name)
    except PluginError as exc:
        errors.append(f"{path}.name: {exc}")
        return None
    try:
        reg.validate_params(comp.params)
    except ValidationError as exc:
        errors.extend(format_validation_error(exc, f"{path}.params"))
    return reg
