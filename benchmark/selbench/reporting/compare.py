"""Reproduction checks: do two leaderboards agree within their noise?

``selbench compare A B`` reads each side's leaderboard (``leaderboard.json``, else
``leaderboard.csv``, in a results folder or a committed leaderboard folder; no cells are
needed) and compares every (experiment, method, metric, point) summary the two share.

Floating point differs between CPUs and library builds, so two runs of one spec on two
machines agree only up to the noise every leaderboard number already carries. For a mean over
seeds that noise has two sources, and the check takes the larger:

* **seed to seed**: the standard error of the mean over seeds, ``std / √n``;
* **the evaluation data**: the bootstrap interval of the mean (``boot_low_mean``,
  ``boot_high_mean``), read as a standard error ``(high − low) / (2 z)`` at its level.

Two means *agree* when ``|a − b| ≤ atol + rtol · max(|a|, |b|) + z · √(noise_a² + noise_b²)``
with ``z`` the two-sided normal quantile of ``level`` (1.96 at 0.95): a difference inside that
band is what another draw of seeds or of evaluation data could give. ``rtol`` (default 1e-5)
and ``atol`` (1e-9) cover float rounding alone, for numbers that carry no noise of either kind
(a deterministic method's metric without a bootstrap interval: its std over seeds is 0; the
committed quickstart's "None" row differs at 1e-8 between torch builds). Two standard deviations over seeds
agree when an F-test of their ratio does not reject equality at ``1 − level`` (two-sided), or
they differ by at most ``atol``. A row present on one side only is a difference.

The provenance of both sides (selbench, Python, torch and NumPy builds, device, CPU model and
instruction set, threads, platform) is compared too, so a reader sees *why* the numbers may
differ: the README's promise is bit-for-bit equality on the same hardware and library builds,
and agreement within noise elsewhere.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CompareError", "Comparison", "Difference", "Summary", "compare", "load_summaries",
           "render_comparison"]

#: provenance fields that say which hardware and library builds made a leaderboard
PROVENANCE_FIELDS = ("selbench", "python", "torch", "torch_cuda_build", "numpy", "device",
                     "device_name", "cpu", "cpu_capability", "threads", "platform")


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

    def noise(self) -> float:
        """The larger of the seed-to-seed and the bootstrap standard error of the mean."""
        seed = self.std / math.sqrt(self.n) if self.n > 1 and math.isfinite(self.std) else 0.0
        boot = 0.0
        if self.boot_low is not None and self.boot_high is not None and self.boot_level:
            boot = (self.boot_high - self.boot_low) / (2 * _z(self.boot_level))
        return max(seed, boot)


@dataclass(frozen=True)
class Difference:
    """A row where the two sides disagree beyond their noise (or one side lacks it)."""

    key: tuple[str, str, str, str]
    a: Summary | None
    b: Summary | None
    what: str


@dataclass
class Comparison:
    """What :func:`compare` found."""

    a: str
    b: str
    compared: int = 0
    differences: list[Difference] = field(default_factory=list)
    provenance: list[tuple[str, Any, Any]] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return not self.differences


def _z(level: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


def _float(value: Any) -> float | None:
    if value in (None, ""):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


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


def _from_json(data: dict) -> dict[tuple[str, str, str, str], Summary]:
    out: dict[tuple[str, str, str, str], Summary] = {}
    for exp in data.get("experiments", []):
        for row in exp.get("rows", []):
            for metric, points in row.get("metrics", {}).items():
                for point, s in points.items():
                    if _float(s.get("mean")) is None:
                        continue
                    boot = s.get("bootstrap") or {}
                    out[(exp["name"], row["method"], metric, str(point))] = Summary(
                        float(s["mean"]), _float(s.get("std")) or 0.0, int(s.get("n") or 1),
                        _float(boot.get("low_mean")), _float(boot.get("high_mean")),
                        _float(boot.get("level")))
    return out


def _from_csv(path: Path) -> dict[tuple[str, str, str, str], Summary]:
    out: dict[tuple[str, str, str, str], Summary] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            mean = _float(row.get("mean"))
            if mean is None:
                continue
            out[(row["experiment"], row["method"], row["metric"], row["point"])] = Summary(
                mean, _float(row.get("std")) or 0.0, int(_float(row.get("n_seeds")) or 1),
                _float(row.get("boot_low_mean")), _float(row.get("boot_high_mean")),
                _float(row.get("boot_level")))
    return out


def load_summaries(path: str | Path) -> tuple[dict[tuple[str, str, str, str], Summary], dict]:
    """Every summary of a leaderboard, keyed by (experiment, method, metric, point), and its
    provenance (from ``leaderboard.json``, else the folder's ``run.json``; empty if neither)."""
    file = _locate(Path(path))
    try:
        if file.suffix == ".json":
            data = json.loads(file.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or "experiments" not in data:
                raise CompareError(f"{file}: not a selbench leaderboard.json (no 'experiments')")
            return _from_json(data), dict(data.get("provenance") or {})
        summaries = _from_csv(file)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, csv.Error) as exc:
        raise CompareError(f"{file}: unreadable leaderboard: {exc}") from None
    run = file.parent / "run.json"
    provenance: dict = {}
    if run.is_file():
        try:
            provenance = dict(json.loads(run.read_text(encoding="utf-8")).get("provenance") or {})
        except (OSError, ValueError, AttributeError):
            provenance = {}
    return summaries, provenance


def _std_agree(a: Summary, b: Summary, level: float, atol: float) -> bool:
    if abs(a.std - b.std) <= atol:
        return True
    if a.n < 2 or b.n < 2 or a.std <= 0 or b.std <= 0:
        return False
    from scipy.stats import f

    ratio = (a.std / b.std) ** 2
    p = 2 * min(f.cdf(ratio, a.n - 1, b.n - 1), f.sf(ratio, a.n - 1, b.n - 1))
    return p >= 1 - level


def _differs(a: Summary, b: Summary, level: float, atol: float, rtol: float) -> str | None:
    band = atol + rtol * max(abs(a.mean), abs(b.mean)) + _z(level) * math.hypot(a.noise(), b.noise())
    if abs(a.mean - b.mean) > band:
        return f"mean differs by {abs(a.mean - b.mean):.3g} > noise band {band:.3g}"
    if not _std_agree(a, b, level, atol):
        return f"std over seeds {a.std:.3g} vs {b.std:.3g} (F-test at {level:g})"
    return None


def compare(a: str | Path, b: str | Path, *, level: float = 0.95,
            atol: float = 1e-9, rtol: float = 1e-5) -> Comparison:
    """Compare two leaderboards (see the module docstring for the rule)."""
    if not 0 < level < 1:
        raise CompareError(f"level: expected a number in (0, 1), got {level}")
    for name, value in (("atol", atol), ("rtol", rtol)):
        if not value >= 0:
            raise CompareError(f"{name}: expected a non-negative number, got {value}")
    sa, pa = load_summaries(a)
    sb, pb = load_summaries(b)
    out = Comparison(str(a), str(b))
    for key in sorted(set(sa) | set(sb)):
        x, y = sa.get(key), sb.get(key)
        if x is None or y is None:
            out.differences.append(Difference(key, x, y, f"only in {'B' if x is None else 'A'}"))
            continue
        out.compared += 1
        why = _differs(x, y, level, atol, rtol)
        if why:
            out.differences.append(Difference(key, x, y, why))
    out.provenance = [(k, pa.get(k), pb.get(k)) for k in PROVENANCE_FIELDS
                      if pa.get(k) != pb.get(k)]
    return out


def _cell(s: Summary | None) -> str:
    return "—" if s is None else f"{s.mean:.6g} ± {s.std:.3g} (n={s.n})"


def render_comparison(result: Comparison) -> str:
    """A plain-text report: the differing rows, the provenance differences, a verdict line."""
    from tabulate import tabulate

    lines = [f"A: {result.a}", f"B: {result.b}", ""]
    if result.differences:
        rows = [[*d.key, _cell(d.a), _cell(d.b), d.what] for d in result.differences]
        lines += [tabulate(rows, headers=["experiment", "method", "metric", "point", "A", "B",
                                          "why"], tablefmt="simple"), ""]
    if result.provenance:
        rows = [[k, "—" if x is None else x, "—" if y is None else y]
                for k, x, y in result.provenance]
        lines += ["provenance differs (numbers may differ within noise):",
                  tabulate(rows, headers=["", "A", "B"], tablefmt="simple"), ""]
    else:
        lines += ["provenance: same selbench, library builds and hardware "
                  "(expect identical numbers)", ""]
    if result.agree:
        lines.append(f"agree: all {result.compared} numbers within their noise")
    else:
        lines.append(f"differ: {len(result.differences)} of "
                     f"{result.compared + sum(d.a is None or d.b is None for d in result.differences)} "
                     "numbers beyond their noise")
    return "\n".join(lines)
