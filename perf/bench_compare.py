"""``selbench compare``'s false-alarm rate and power (the README's Reproducibility figures).

A small quickstart-like spec (the digits shift, six methods: None, temperature scaling,
histogram binning, Platt binning, the MLP recalibrator, the confidence selector; 48 numbers
at the AUC over β) is run:

* with seeds 0-19 once; leaderboards of seeds 0-4, 5-9, 10-14, 15-19 are made from its cells
  (a cell depends only on its own key), and every pair is compared: false alarms of
  disjoint seeds of one spec;
* with seeds 0-9 under ``ATEN_CPU_CAPABILITY=avx2`` with its own cache (the backbone is
  retrained): false alarms of another CPU setting (same and other seeds);
* with histogram binning at 14 bins instead of 15, and with the temperature pinned 5 %
  above its fitted value (about 1.50 on this data: ``min_temperature = 1.5761``): power,
  with the same seeds, other seeds and across the CPU settings.

Usage: ``python perf/bench_compare.py --out /tmp/compare`` (about 30 minutes on 2 busy
cores; ``--measure-only`` compares what an earlier run left in ``--out``). The README's
figures came from the same runs made by a shell script of the same steps, then
``--measure-only``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
KEEP = ("None", "Temp. scale", "Hist. binning", "Platt binning", "MLP recalibrator", "Confidence")


def _specs(out: Path) -> dict[str, Path]:
    base = yaml.safe_load((REPO / "specs" / "quickstart.yaml").read_text())
    base["name"] = "cmp"
    base["experiments"][0]["methods"] = [m for m in base["experiments"][0]["methods"]
                                         if m["label"] in KEEP]
    variants = {"cmp": {}, "bins14": {"Hist. binning": {"n_bins": 14}},
                "temp105": {"Temp. scale": {"min_temperature": 1.5761,
                                            "max_temperature": 1.5762}}}
    paths = {}
    for name, params in variants.items():
        spec = yaml.safe_load(yaml.safe_dump(base))
        spec["seeds"] = list(range(20 if name == "cmp" else 10))
        for m in spec["experiments"][0]["methods"]:
            if m["label"] in params:
                m["recalibrator"]["params"] = params[m["label"]]
        paths[name] = out / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(spec, sort_keys=False))
    return paths


def _run(spec: Path, out: Path, cache: Path, seeds: list[int] | None = None,
         env: dict | None = None) -> None:
    cmd = [sys.executable, "-m", "selbench", "run", str(spec), "--out", str(out),
           "--cache-dir", str(cache), "--no-progress", "--no-plots", "-q"]
    if seeds is not None:
        cmd += ["--set", "seeds=[" + ",".join(map(str, seeds)) + "]"]
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {})})


def _group(src: Path, spec: Path, dst: Path, cache: Path, seeds: list[int],
           env: dict | None = None) -> None:
    """A leaderboard of ``seeds`` from the cells of ``src`` (reused, not recomputed)."""
    if not (dst / "leaderboard.json").is_file():
        shutil.copytree(src / "cells", dst / "cells", dirs_exist_ok=True)
        _run(spec, dst, cache, seeds, env)


def make_runs(out: Path) -> None:
    specs = _specs(out)
    cache, cache2 = out / "cache", out / "cache_avx2"
    avx2 = {"ATEN_CPU_CAPABILITY": "avx2"}
    _run(specs["cmp"], out / "base20", cache)
    for g in range(4):
        _group(out / "base20", specs["cmp"], out / f"g{g}", cache, list(range(5 * g, 5 * g + 5)))
    for name in ("bins14", "temp105"):
        shutil.copytree(out / "base20" / "cells", out / name / "cells", dirs_exist_ok=True)
        _run(specs[name], out / name, cache)
    specs10 = out / "cmp10.yaml"
    spec10 = yaml.safe_load(specs["cmp"].read_text())
    spec10["seeds"] = list(range(10))
    specs10.write_text(yaml.safe_dump(spec10, sort_keys=False))
    _run(specs10, out / "avx2", cache2, env=avx2)
    for g in range(2):
        seeds = list(range(5 * g, 5 * g + 5))
        for name in ("bins14", "temp105"):
            _group(out / name, specs[name], out / f"{name}_g{g}", cache, seeds)
        _group(out / "avx2", specs10, out / f"avx2_g{g}", cache2, seeds, avx2)


def _show(out: Path, name: str, a: str, b: str) -> None:
    from selbench.reporting.compare import compare

    res = compare(out / a, out / b)
    raw = sum(p < 0.05 for p in res.p_values.values())
    flagged = sorted({f"{d.key[1]}/{d.key[2]}" for d in res.differences})
    print(f"{name}: {a} vs {b}: {'agree' if res.agree else 'DIFFER'} ({len(res.differences)} "
          f"of {res.compared} flagged, {len(res.unjudged)} unjudged, raw p<0.05: {raw}) "
          f"{flagged[:6]}")


def measure(out: Path) -> None:
    print("== false alarms: disjoint seeds of one spec, same machine")
    for i, j in itertools.combinations(range(4), 2):
        _show(out, "seeds", f"g{i}", f"g{j}")
    print("== false alarms: another CPU setting (ATEN_CPU_CAPABILITY=avx2, backbone retrained)")
    for a, b in (("g0", "avx2_g0"), ("g1", "avx2_g1"), ("g0", "avx2_g1"), ("g1", "avx2_g0")):
        _show(out, "avx2", a, b)
    for change, label in (("bins14", "14 bins instead of 15"), ("temp105", "temperature +5%")):
        print(f"== power: {label}")
        for a, b in (("g0", f"{change}_g0"), ("g1", f"{change}_g1"), ("g0", f"{change}_g1"),
                     ("g1", f"{change}_g0"), ("avx2_g0", f"{change}_g0")):
            _show(out, change, a, b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/compare"))
    ap.add_argument("--measure-only", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.measure_only:
        make_runs(args.out)
    measure(args.out)


if __name__ == "__main__":
    main()
