"""The sides of ``selbench compare``: a leaderboard read and checked (:func:`load_side`).

A side is a ``leaderboard.json`` (preferred) or ``leaderboard.csv``, given as the file or a
folder holding one (a results folder or a committed leaderboard folder). Everything compare
needs is checked as it is read, and anything else is bad input (:class:`CompareError`, one
line naming the file and the entry): a wrong type (``"experiments": "xyz"``, a string for
``n``, ``metrics`` as a list), a missing leaderboard column, a NUL byte, an infinite number,
a mean of ``nan`` whose standard deviation is a number (a leaderboard writes ``nan`` for both
where a metric has no value on some seed), and a side with no number at all.

From ``leaderboard.json`` each number keeps its per-seed ``values`` and ``seeds`` (the paired
test of :mod:`selbench.reporting.compare` needs them) and its bootstrap interval; the side's
provenance and spec come from it too. A CSV holds means, standard deviations and the mean
bootstrap bounds only; its provenance and spec come from the folder's ``run.json``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CSV_COLUMNS", "CompareError", "Side", "Summary", "data_fingerprints", "load_side"]

#: the columns a leaderboard.csv must have (the ``boot_*`` ones are optional)
CSV_COLUMNS = ("experiment", "method", "metric", "point", "mean", "std", "n_seeds")
_BOOT_COLUMNS = ("boot_level", "boot_low_mean", "boot_high_mean")

Key = tuple[str, str, str, str]


class CompareError(ValueError):
    """A side that cannot be read as a leaderboard."""


@dataclass(frozen=True)
class Summary:
    """One leaderboard number: a metric of a method at a point, summarised over seeds."""

    mean: float
    std: float
    n: int
    boot_low: float | None = None
    boot_high: float | None = None
    boot_level: float | None = None
    seeds: tuple[int, ...] | None = None
    values: tuple[float, ...] | None = None

    @property
    def has_value(self) -> bool:
        return math.isfinite(self.mean)

    def seed_se(self) -> float:
        """The standard error of the mean over seeds, ``std / √n`` (0 with one seed)."""
        return self.std / math.sqrt(self.n) if self.n > 1 and math.isfinite(self.std) else 0.0

    def boot_se(self) -> float | None:
        """The bootstrap interval over the evaluation examples read as a standard error,
        ``(high − low) / (2 z)`` at its level; None without one."""
        if self.boot_low is None or self.boot_high is None or not self.boot_level:
            return None
        from scipy.stats import norm

        return (self.boot_high - self.boot_low) / (2 * float(norm.ppf(0.5 + self.boot_level / 2)))

    def noise(self) -> float:
        """The larger of the seed-to-seed and the bootstrap standard error of the mean."""
        return max(self.seed_se(), self.boot_se() or 0.0)


@dataclass
class Side:
    """One side of a comparison: its numbers, provenance, (canonical) spec and, where its
    folder holds cells, a fingerprint of each experiment's evaluation data
    (:func:`data_fingerprints`)."""

    file: Path
    summaries: dict[Key, Summary]
    provenance: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] | None = None
    fingerprints: dict[str, dict[int, str]] = field(default_factory=dict)


def data_fingerprints(folder: Path) -> dict[str, dict[int, str]]:
    """``{experiment: {seed: digest}}``: the SHA-256 of the backbone's raw confidence on the
    evaluation rows (``raw_confidence`` of the cells' per-example arrays, the same for every
    method of a seed), which tells whether two runs evaluated on the same backbone outputs
    (a backbone trained in-process on other hardware may give others). Empty where the
    folder holds no cells; an unreadable cell is skipped (it only weakens the check)."""
    import hashlib

    import numpy as np

    out: dict[str, dict[int, str]] = {}
    cells = folder / "cells"
    if not cells.is_dir() or cells.is_symlink():
        return out
    for npz in sorted(cells.glob("*/*/seed*.npz"))[:2000]:
        try:
            rec = json.loads(npz.with_suffix(".json").read_text(encoding="utf-8"))
            exp, seed = rec["experiment"], int(rec["seed"])
            if seed in out.get(exp, {}):
                continue
            with np.load(npz, allow_pickle=False) as arrays:
                raw = np.ascontiguousarray(arrays["raw_confidence"], dtype=np.float64)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.setdefault(str(exp), {})[seed] = hashlib.sha256(raw.tobytes()).hexdigest()
    return out


def _locate(path: Path) -> Path:
    """The leaderboard file of ``path``: the file itself, or the JSON (else CSV) in it."""
    if path.is_file():
        if path.suffix not in (".json", ".csv"):
            raise CompareError(f"{path}: expected a leaderboard.json, a leaderboard.csv or a "
                               "folder holding one")
        return path
    if not path.is_dir():
        raise CompareError(f"{path}: no such file or folder")
    for name in ("leaderboard.json", "leaderboard.csv"):
        if (path / name).is_file():
            return path / name
    raise CompareError(f"{path}: holds no leaderboard.json or leaderboard.csv "
                       "(run `selbench leaderboard` on a results folder first)")


# --------------------------------------------------------------------------- checked values
def _bad(file: Path, where: str, what: str) -> CompareError:
    return CompareError(f"{file}: {where}: {what}")


def _number(value: Any, file: Path, where: str, *, allow_nan: bool = True,
            text: bool = False) -> float:
    """A float from a JSON number (not a bool) or, with ``text``, a CSV cell; inf is never a
    leaderboard value."""
    if isinstance(value, bool) or not isinstance(value, (int, float, *((str,) if text else ()))):
        raise _bad(file, where, f"expected a number, got {type(value).__name__} {value!r:.40}")
    try:
        out = float(value)
    except ValueError:
        raise _bad(file, where, f"expected a number, got {value!r:.40}") from None
    if math.isinf(out) or (math.isnan(out) and not allow_nan):
        raise _bad(file, where, f"expected a finite number, got {value!r:.40}")
    return out


def _count(value: Any, file: Path, where: str, text: bool = False) -> int:
    if text and isinstance(value, str):
        value = _number(value, file, where, allow_nan=False, text=True)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) \
            or value < 1:
        raise _bad(file, where, f"expected a whole number >= 1, got {value!r:.40}")
    return int(value)


def _seed(value: Any, file: Path, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(file, where, f"expected a seed (a whole number >= 0), got {value!r:.40}")
    return value


def _typed(value: Any, kind: type, file: Path, where: str) -> Any:
    if not isinstance(value, kind):
        raise _bad(file, where, f"expected {'an object' if kind is dict else 'a ' + kind.__name__}"
                   f", got {type(value).__name__} {json.dumps(value)[:40]}")
    return value


def _summary(file: Path, where: str, mean: float, std: float, n: int,
             boot: tuple[float | None, float | None, float | None],
             seeds: tuple[int, ...] | None = None,
             values: tuple[float, ...] | None = None) -> Summary:
    """A checked :class:`Summary`: a mean of nan only with a std of nan (no value), a std
    that is not negative, a bootstrap interval with low <= high at a level in (0, 1)."""
    if math.isnan(mean) and not math.isnan(std):
        raise _bad(file, where, "mean is nan but std is a number (a leaderboard without a "
                   "value writes nan for both)")
    if std < 0:
        raise _bad(file, where, f"std is negative ({std!r})")
    level, low, high = boot
    if (level is None) != (low is None) or (low is None) != (high is None):
        raise _bad(file, where, "bootstrap interval incomplete (level, low and high go together)")
    if level is not None and not 0 < level < 1:
        raise _bad(file, where, f"bootstrap level {level!r} not in (0, 1)")
    if low is not None and high is not None and low > high:
        raise _bad(file, where, f"bootstrap interval [{low!r}, {high!r}] has low > high")
    if values is not None and len(values) != n:
        raise _bad(file, where, f"{len(values)} values for n = {n}")
    if seeds is not None and (len(seeds) != n or len(set(seeds)) != n):
        raise _bad(file, where, f"seeds {list(seeds)} are not n = {n} distinct seeds")
    return Summary(mean, std, n, low, high, level, seeds, values)


# --------------------------------------------------------------------------- leaderboard.json
def _json_point(file: Path, where: str, s: Any) -> Summary:
    s = _typed(s, dict, file, where)
    if "mean" not in s or "n" not in s:
        raise _bad(file, where, "no 'mean' or no 'n'")
    mean = _number(s["mean"], file, f"{where}.mean") if s["mean"] is not None else math.nan
    std = _number(s["std"], file, f"{where}.std") if s.get("std") is not None else (
        math.nan if math.isnan(mean) else 0.0)
    n = _count(s["n"], file, f"{where}.n")
    boot: tuple[float | None, float | None, float | None] = (None, None, None)
    if s.get("bootstrap") is not None:
        b = _typed(s["bootstrap"], dict, file, f"{where}.bootstrap")
        boot = tuple(_number(b.get(k), file, f"{where}.bootstrap.{k}", allow_nan=False)
                     if b.get(k) is not None else None
                     for k in ("level", "low_mean", "high_mean"))  # type: ignore[assignment]
    seeds = values = None
    if s.get("seeds") is not None and s.get("values") is not None:
        seeds = tuple(_seed(x, file, f"{where}.seeds")
                      for x in _typed(s["seeds"], list, file, f"{where}.seeds"))
        values = tuple(_number(v, file, f"{where}.values")
                       for v in _typed(s["values"], list, file, f"{where}.values"))
    return _summary(file, where, mean, std, n, boot, seeds, values)


def _from_json(file: Path, data: Any) -> dict[Key, Summary]:
    data = _typed(data, dict, file, "the top level")
    if "experiments" not in data:
        raise CompareError(f"{file}: not a selbench leaderboard.json (no 'experiments')")
    out: dict[Key, Summary] = {}
    for e_i, exp in enumerate(_typed(data["experiments"], list, file, "experiments")):
        at = f"experiments[{e_i}]"
        exp = _typed(exp, dict, file, at)
        name = _typed(exp.get("name"), str, file, f"{at}.name")
        for r_i, row in enumerate(_typed(exp.get("rows"), list, file, f"{at}.rows")):
            rat = f"{at}.rows[{r_i}]"
            row = _typed(row, dict, file, rat)
            method = _typed(row.get("method"), str, file, f"{rat}.method")
            for metric, points in _typed(row.get("metrics"), dict, file,
                                         f"{rat}.metrics").items():
                mat = f"{rat}.metrics.{metric}"
                for point, s in _typed(points, dict, file, mat).items():
                    key = (name, method, metric, str(point))
                    if key in out:
                        raise _bad(file, f"{mat}.{point}", "appears twice")
                    out[key] = _json_point(file, f"{mat}.{point}", s)
    return out


# --------------------------------------------------------------------------- leaderboard.csv
def _csv_row(file: Path, line: int, row: dict[str, Any], boot_cols: bool) -> Summary:
    where = f"line {line}"
    cells = {k: (row.get(k) or "").strip() for k in (*CSV_COLUMNS, *_BOOT_COLUMNS)}
    for k in CSV_COLUMNS:
        if not cells[k]:
            raise _bad(file, where, f"empty {k!r}")
    mean = _number(cells["mean"], file, f"{where}, mean", text=True)
    std = _number(cells["std"], file, f"{where}, std", text=True)
    n = _count(cells["n_seeds"], file, f"{where}, n_seeds", text=True)
    boot: tuple[float | None, float | None, float | None] = (None, None, None)
    if boot_cols and any(cells[k] for k in _BOOT_COLUMNS):
        boot = tuple(_number(cells[k], file, f"{where}, {k}", allow_nan=False, text=True)
                     if cells[k]
                     else None for k in _BOOT_COLUMNS)  # type: ignore[assignment]
    return _summary(file, where, mean, std, n, boot)


def _from_csv(file: Path, text: str) -> dict[Key, Summary]:
    if "\x00" in text:
        line = text[:text.index("\x00")].count("\n") + 1
        raise _bad(file, f"line {line}", "holds NUL bytes (not a text leaderboard.csv)")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    missing = [c for c in CSV_COLUMNS if c not in header]
    if missing:
        raise CompareError(f"{file}: not a selbench leaderboard.csv: no column "
                           f"{', '.join(missing)} (has: {', '.join(header)[:120] or 'nothing'})")
    out: dict[Key, Summary] = {}
    for i, row in enumerate(reader):
        if None in row or any(v is None for v in row.values()):
            raise _bad(file, f"line {i + 2}", f"{len(header)} columns expected")
        key = tuple(row[k].strip() for k in CSV_COLUMNS[:4])
        if key in out:
            raise _bad(file, f"line {i + 2}", f"{', '.join(key)} appears twice")
        out[key] = _csv_row(file, i + 2, row, all(c in header for c in _BOOT_COLUMNS))  # type: ignore[index]
    return out


def _run_json(file: Path) -> dict[str, Any]:
    """The folder's ``run.json`` (provenance and spec of a CSV side); empty if unreadable."""
    run = file.parent / "run.json"
    try:
        data = json.loads(run.read_text(encoding="utf-8")) if run.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_side(path: str | Path) -> Side:
    """Read and check one side (see the module docstring); :class:`CompareError` otherwise."""
    file = _locate(Path(path))
    try:
        text = file.read_text(encoding="utf-8")
        if file.suffix == ".json":
            data = json.loads(text)
            summaries = _from_json(file, data)
            prov, spec = data.get("provenance"), data.get("spec")
            for name, value in (("provenance", prov), ("spec", spec)):
                if value is not None:
                    _typed(value, dict, file, name)
        else:
            summaries = _from_csv(file, text)
            run = _run_json(file)
            prov, spec = run.get("provenance"), run.get("spec")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error) as exc:
        raise CompareError(f"{file}: unreadable leaderboard: {exc}") from None
    if not summaries:
        raise CompareError(f"{file}: holds no leaderboard numbers")
    return Side(file, summaries, prov if isinstance(prov, dict) else {},
                spec if isinstance(spec, dict) else None, data_fingerprints(file.parent))
