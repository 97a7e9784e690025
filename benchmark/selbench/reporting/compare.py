"""Reproduction checks: do two leaderboards agree within their noise?

``selbench compare A B`` reads each side's leaderboard (``leaderboard.json``, else
``leaderboard.csv``, in a results folder or a committed leaderboard folder; no cells are
needed; :mod:`selbench.reporting.compare_input` checks them: anything unreadable is bad
input) and compares every (experiment, method, metric, point) number the two share. The
verdict fits the situation, which the provenance, the spec and the seeds of both sides tell:

* **Identical provenance and inputs** (same selbench code digests, library builds, hardware
  and threads, input digests, spec hash and seeds): the numbers must be identical, so any
  difference beyond float rounding (``atol + rtol · max(|a|, |b|)``, defaults 1e-9 and
  1e-5), seed by seed, differs. The same holds for every number whose seeds and evaluation
  data are the same on two sides made by the same builds and hardware, whatever else
  differs in the spec or the code: the run is deterministic there, so a difference is the
  change's (histogram binning with 14 bins instead of 15), not noise.
* Otherwise each number gets a two-sided test of "no difference", at most as strict as
  rounding (the rounding tolerance is taken off the difference first):

  - **the same seeds** on both sides (on other builds or hardware, or other evaluation
    data): a paired t-test of the per-seed differences (``leaderboard.json`` holds each
    seed's value; a CSV has none, so there the means are compared as for different seeds,
    which is conservative);
  - **different seeds**: Welch's unpaired t-test of the two means from their standard
    deviations over seeds. The seed-to-seed standard deviations themselves are not judged
    (with five seeds an F-test of two of them false-alarms on harmless runs);
  - **the evaluation data** count only where they may differ: where the two sides' input
    digests, dataset code or data settings of the experiment (dataset, backbone, splits,
    ``n_fit``, ``n_eval``) differ, or the backbone's outputs on the evaluation rows (a
    backbone trained in-process may give other outputs on other hardware): where both
    folders hold cells, the raw confidence they store tells
    (:func:`selbench.reporting.compare_input.data_fingerprints`), else the backbone and
    core code and the builds and hardware must be the same. Then each side's bootstrap interval
    over the evaluation examples, read as a standard error ``(high − low) / (2 z)``, adds
    its variance (Satterthwaite's degrees of freedom); where one is missing the number
    gets **no noise estimate** and is not judged (never on the rounding tolerance). With
    the same evaluation data the bootstrap part is shared by both sides: not noise.
  - A number without spread (a deterministic method, ``coverage``) differs as soon as it
    differs beyond rounding.

  The false alarms are controlled over all the numbers compared at once
  (Benjamini-Hochberg, ``scipy.stats.false_discovery_control``, at ``1 − level``): when
  nothing changed, the chance that any number is called different is at most ``1 − level``.
* A number present on one side only, or with a value on one side only, is a difference.
  Zero numbers judged is never "agree".

The report says what differs in the spec (hash and the differing entries), the seeds, the
code and the provenance (selbench, Python, torch and NumPy builds, device, CPU model and
instruction set, threads, platform), and which test judged the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from selbench.reporting.compare_input import CompareError, Side, Summary, load_side

__all__ = ["CompareError", "Comparison", "Difference", "Summary", "compare", "load_summaries",
           "render_comparison"]

#: provenance fields that say which hardware and library builds made a leaderboard
PROVENANCE_FIELDS = ("selbench", "python", "torch", "torch_cuda_build", "numpy", "device",
                     "device_name", "cpu", "cpu_capability", "threads", "platform")
#: the settings of an experiment that decide its evaluation data
DATA_SETTINGS = ("dataset", "backbone", "fit_split", "eval_split", "n_fit", "n_eval")
#: metrics fixed by β and the evaluation set's size: no sampling noise of their own
EXACT_METRICS = frozenset({"coverage"})

Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class Difference:
    """A number where the two sides disagree beyond their noise (or one side lacks it), or,
    in :attr:`Comparison.unjudged`, one that has no noise estimate."""

    key: Key
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
    unjudged: list[Difference] = field(default_factory=list)
    setting: list[str] = field(default_factory=list)
    identical: bool = False
    #: each judged number's p-value of "no difference" (before the false-alarm control)
    p_values: dict[Key, float] = field(default_factory=dict)

    @property
    def agree(self) -> bool:
        return not self.differences and self.compared > 0


def load_summaries(path: str | Path) -> tuple[dict[Key, Summary], dict]:
    """Every number of a leaderboard, keyed by (experiment, method, metric, point), and its
    provenance (from ``leaderboard.json``, else the folder's ``run.json``; empty if neither)."""
    side = load_side(path)
    return side.summaries, side.provenance


# --------------------------------------------------------------------------- the situation
@dataclass
class _Situation:
    """What the two sides share: builds, code, inputs, spec, seeds, evaluation data."""

    same_build: bool
    identical: bool
    eval_same: dict[str, bool]
    seeds: tuple[Any, Any]
    lines: list[str]


def _exp_settings(spec: dict | None) -> dict[str, Any]:
    exps = spec.get("experiments") if isinstance(spec, dict) else None
    if not isinstance(exps, list):
        return {}
    return {e.get("name"): {k: e.get(k) for k in DATA_SETTINGS} for e in exps
            if isinstance(e, dict)}


def _eval_same(a: Side, b: Side, same_build: bool) -> dict[str, bool]:
    """Per experiment: are both sides' evaluation data certainly the same? The same input
    digests, data settings and dataset code, and the same backbone outputs on the same
    evaluation rows: where both folders hold cells, their fingerprints at a seed both hold
    (:func:`selbench.reporting.compare_input.data_fingerprints`) decide; otherwise the same
    backbone and core code on the same builds and hardware (a backbone trained in-process
    may give other outputs elsewhere)."""
    pa, pb = a.provenance, b.provenance
    if pa.get("inputs") != pb.get("inputs") or not pa.get("code"):
        return {}
    code_a, code_b = pa.get("code") or {}, pb.get("code") or {}
    sa, sb = _exp_settings(a.spec), _exp_settings(b.spec)
    out = {}
    for name, settings in sa.items():
        if name not in sb or sb[name] != settings:
            continue
        fa, fb = a.fingerprints.get(name, {}), b.fingerprints.get(name, {})
        common = sorted(set(fa) & set(fb))
        parts = [f"dataset/{(settings.get('dataset') or {}).get('name')}"]
        if not common:
            parts += ["core", f"backbone/{(settings.get('backbone') or {}).get('name')}"]
        same_code = all(code_a.get(p) is not None and code_a.get(p) == code_b.get(p)
                        for p in parts)
        out[name] = same_code and (all(fa[s] == fb[s] for s in common) if common
                                   else same_build)
    return out


def _spec_paths(x: Any, y: Any, at: str = "") -> list[str]:
    """The entries where two specs differ, as ``path: A vs B``."""
    if isinstance(x, dict) and isinstance(y, dict):
        return [line for k in dict.fromkeys([*x, *y]) if k not in ("seeds",)
                for line in _spec_paths(x.get(k), y.get(k), f"{at}.{k}" if at else str(k))]
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        return [line for i, (u, v) in enumerate(zip(x, y))
                for line in _spec_paths(u, v, f"{at}[{i}]")]
    return [] if x == y else [f"{at}: {_short(x)} vs {_short(y)}"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _seeds_line(sa: Any, sb: Any) -> str:
    if sa is None or sb is None:
        return "seeds: not recorded on " + ("both sides" if sa == sb else
                                            "side A" if sa is None else "side B")
    if sa == sb:
        return f"seeds: the same on both sides {sa} (per-seed differences are paired)"
    return f"seeds differ: A {sa}, B {sb} (means compared unpaired, Welch)"


def _situation(a: Side, b: Side) -> _Situation:
    pa, pb = a.provenance, b.provenance
    same_build = bool(pa) and bool(pb) and all(pa.get(k) == pb.get(k) for k in PROVENANCE_FIELDS)
    ha, hb = pa.get("spec_hash"), pb.get("spec_hash")
    seeds = (pa.get("seeds"), pb.get("seeds"))
    code_same = bool(pa.get("code")) and pa.get("code") == pb.get("code")
    identical = (same_build and code_same and pa.get("inputs") == pb.get("inputs")
                 and ha is not None and ha == hb and seeds[0] is not None
                 and seeds[0] == seeds[1])
    lines = []
    paths = _spec_paths(a.spec or {}, b.spec or {})
    if ha is not None and ha == hb:
        lines.append(f"spec: the same (hash {str(ha)[:12]})")
    elif a.spec is not None and b.spec is not None and not paths:
        lines.append(f"spec: the same apart from the seeds (hash {str(ha)[:12]} vs "
                     f"{str(hb)[:12]})")
    else:
        lines.append(f"spec differs: hash {str(ha)[:12]} vs {str(hb)[:12]}"
                     + ("" if a.spec is not None and b.spec is not None
                        else " (a side records no spec)"))
        lines += [f"  {p}" for p in paths[:12]]
        if len(paths) > 12:
            lines.append(f"  ... and {len(paths) - 12} more entries")
    lines.append(_seeds_line(*seeds))
    if not code_same:
        ca, cb = pa.get("code") or {}, pb.get("code") or {}
        parts = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
        lines.append("code differs: " + (", ".join(parts[:8]) if parts else "not recorded"))
    if pa.get("inputs") != pb.get("inputs"):
        lines.append("input files differ (digests)")
    eval_same = _eval_same(a, b, same_build)
    for name in sorted({k[0] for k in a.summaries} | {k[0] for k in b.summaries}):
        lines.append(f"evaluation data of {name}: " + (
            "the same on both sides (their bootstrap noise is shared: not counted)"
            if eval_same.get(name) else "may differ (each side's bootstrap noise counts)"))
    return _Situation(same_build, identical, eval_same, seeds, lines)


# --------------------------------------------------------------------------- one number
def _exact_test(x: Summary, y: Summary, tol: float, why: str) -> tuple[float, str]:
    """Numbers that must be identical: p = 0 (differs) beyond rounding, seed by seed."""
    worst, where = abs(x.mean - y.mean), "mean"
    if x.seeds is not None and x.seeds == y.seeds and x.values and y.values:
        for s, u, v in zip(x.seeds, x.values, y.values):
            if abs(u - v) > worst:
                worst, where = abs(u - v), f"seed {s}"
    if worst > tol:
        return 0.0, (f"{where} differs by {worst:.3g} > rounding {tol:.3g} ({why}: identical "
                     "numbers expected)")
    return 1.0, ""


def _same_seeds(x: Summary, y: Summary, sit: _Situation) -> bool:
    if x.seeds is not None and y.seeds is not None:
        return x.seeds == y.seeds
    return sit.seeds[0] is not None and sit.seeds[0] == sit.seeds[1]


def _seed_part(x: Summary, y: Summary, same_build: bool) -> tuple[float, float, str] | str:
    """(variance of the mean difference over seeds, its degrees of freedom, the test's name),
    or why there is none."""
    if x.seeds is not None and x.seeds == y.seeds and x.values and y.values and x.n >= 2:
        d = np.asarray(x.values) - np.asarray(y.values)
        return float(np.var(d, ddof=1)) / x.n, x.n - 1.0, f"paired over {x.n} seeds"
    if x.n >= 2 and y.n >= 2:
        va, vb = x.std ** 2 / x.n, y.std ** 2 / y.n
        df = ((va + vb) ** 2 / (va ** 2 / (x.n - 1) + vb ** 2 / (y.n - 1))
              if va + vb > 0 else math.inf)
        return va + vb, df, "Welch, unpaired seeds"
    if x.seeds is not None and x.seeds == y.seeds and same_build:
        return 0.0, math.inf, "one seed, the same on both sides"
    return "one seed on a side: no seed-to-seed noise estimate"


def _number_test(x: Summary, y: Summary, metric: str, sit: _Situation, eval_same: bool,
                 tol: float) -> tuple[float, str] | str:
    """(p-value of "no difference", description), or why the number has no noise estimate.
    The same build, seeds and evaluation data make every number deterministic: any
    difference beyond rounding is the spec's or the code's, not noise."""
    if sit.identical:
        return _exact_test(x, y, tol, "identical provenance, spec and seeds")
    if sit.same_build and eval_same and _same_seeds(x, y, sit):
        return _exact_test(x, y, tol, "same builds, hardware, seeds and evaluation data")
    seed = _seed_part(x, y, sit.same_build)
    if isinstance(seed, str):
        return f"no noise estimate ({seed})"
    var, df, name = seed
    if not eval_same and metric not in EXACT_METRICS:
        bx, by = x.boot_se(), y.boot_se()
        if bx is None or by is None:
            side = "A" if bx is None else "B"
            return (f"no noise estimate (no bootstrap interval on side {side}, and the "
                    "evaluation data may differ)")
        boot = bx ** 2 + by ** 2
        df = (var + boot) ** 2 / (var ** 2 / df) if var > 0 else math.inf
        var += boot
        name += " + bootstrap"
    excess = max(abs(x.mean - y.mean) - tol, 0.0)
    if var <= 0:
        return (0.0 if excess > 0 else 1.0), f"differs by {abs(x.mean - y.mean):.3g} with no " \
                                             f"spread (rounding {tol:.3g})"
    from scipy.stats import t

    stat = excess / math.sqrt(var)
    p = float(2 * t.sf(stat, df)) if math.isfinite(df) else float(2 * t.sf(stat, 1e9))
    return p, f"mean differs by {x.mean - y.mean:+.3g} (t = {stat:.2f}, {name}, p = {p:.2g})"


# --------------------------------------------------------------------------- compare
def _check_options(level: float, atol: float, rtol: float) -> None:
    if not 0 < level < 1:
        raise CompareError(f"level: expected a number in (0, 1), got {level}")
    for name, value in (("atol", atol), ("rtol", rtol)):
        if not value >= 0:
            raise CompareError(f"{name}: expected a non-negative number, got {value}")


def compare(a: str | Path, b: str | Path, *, level: float = 0.95,
            atol: float = 1e-9, rtol: float = 1e-5) -> Comparison:
    """Compare two leaderboards (see the module docstring for the rule)."""
    _check_options(level, atol, rtol)
    sa, sb = load_side(a), load_side(b)
    sit = _situation(sa, sb)
    out = Comparison(str(a), str(b), setting=sit.lines, identical=sit.identical)
    tested: list[tuple[Key, Summary, Summary, float, str]] = []
    exact = 0
    for key in sorted(set(sa.summaries) | set(sb.summaries)):
        x, y = sa.summaries.get(key), sb.summaries.get(key)
        if x is None or y is None:
            out.differences.append(Difference(key, x, y, f"only in {'B' if x is None else 'A'}"))
        elif not (x.has_value and y.has_value):
            if x.has_value or y.has_value:
                out.differences.append(Difference(
                    key, x, y, f"no value in {'A' if not x.has_value else 'B'}"))
            else:
                out.compared += 1
        else:
            tol = atol + rtol * max(abs(x.mean), abs(y.mean))
            same_data = bool(sit.eval_same.get(key[0]))
            exact += sit.identical or (sit.same_build and same_data and _same_seeds(x, y, sit))
            got = _number_test(x, y, key[2], sit, same_data, tol)
            if isinstance(got, str):
                out.unjudged.append(Difference(key, x, y, got))
            else:
                tested.append((key, x, y, *got))
    out.compared += len(tested)
    out.p_values = {key: p for key, _, _, p, _ in tested}
    if tested:
        from scipy.stats import false_discovery_control

        adjusted = false_discovery_control([p for *_, p, _ in tested], method="bh")
        for (key, x, y, _, what), q in zip(tested, adjusted):
            if q <= 1 - level:
                note = "" if sit.identical or q == 0 else f", BH-adjusted {q:.2g}"
                out.differences.append(Difference(key, x, y, what + note))
    out.provenance = [(k, sa.provenance.get(k), sb.provenance.get(k)) for k in PROVENANCE_FIELDS
                      if sa.provenance.get(k) != sb.provenance.get(k)]
    if exact:
        out.setting.append(f"test: {exact} numbers with the same builds, hardware, seeds and "
                           "evaluation data on both sides must be identical up to rounding")
    if len(tested) > exact:
        out.setting.append(f"test: {len(tested) - exact} numbers by two-sided t-tests at "
                           f"{level:g}, false alarms controlled over all {len(tested)} "
                           "(Benjamini-Hochberg)")
    return out


# --------------------------------------------------------------------------- report
def _cell(s: Summary | None) -> str:
    if s is None:
        return "—"
    return f"{s.mean:.6g} ± {s.std:.3g} (n={s.n})"


def _table(diffs: list[Difference]) -> str:
    from tabulate import tabulate

    rows = [[*d.key, _cell(d.a), _cell(d.b), d.what] for d in diffs]
    return tabulate(rows, headers=["experiment", "method", "metric", "point", "A", "B", "why"],
                    tablefmt="simple")


def render_comparison(result: Comparison) -> str:
    """A plain-text report: the differing numbers, those without a noise estimate, what
    differs in spec, seeds, code and provenance, and a verdict line."""
    from tabulate import tabulate

    lines = [f"A: {result.a}", f"B: {result.b}", ""]
    if result.differences:
        lines += [_table(result.differences), ""]
    if result.unjudged:
        lines += [f"no noise estimate: {len(result.unjudged)} numbers not judged", "",
                  _table(result.unjudged[:20]), ""]
        if len(result.unjudged) > 20:
            lines += [f"... and {len(result.unjudged) - 20} more", ""]
    lines += [*result.setting, ""]
    if result.provenance:
        rows = [[k, "—" if x is None else x, "—" if y is None else y]
                for k, x, y in result.provenance]
        lines += ["provenance differs (numbers may differ within noise):",
                  tabulate(rows, headers=["", "A", "B"], tablefmt="simple"), ""]
    elif result.identical:
        lines += ["provenance: the same selbench code, library builds, hardware, spec and "
                  "seeds (expect identical numbers)", ""]
    else:
        lines += ["provenance: the same library builds and hardware", ""]
    total = result.compared + sum(d.what.startswith(("only in", "no value in"))
                                  for d in result.differences)
    unjudged = f" ({len(result.unjudged)} without a noise estimate, not judged)" \
        if result.unjudged else ""
    if result.differences:
        lines.append(f"differ: {len(result.differences)} of {total} numbers beyond their "
                     f"noise{unjudged}")
    elif result.compared == 0:
        lines.append(f"no verdict: none of the {len(result.unjudged)} numbers has a noise "
                     "estimate")
    else:
        lines.append(f"agree: all {result.compared} numbers within their noise{unjudged}")
    return "\n".join(lines)
