"""Write a selbench spec running an existing spec's methods over every experiment of a
CalArena benchmark (the ``calarena`` dataset, :mod:`selbench_plugins.datasets.calarena`)::

    python -m selbench_plugins.datasets.calarena_spec FOLDER BENCHMARK --like SPEC --out OUT \\
        [--experiment NAME] [--limit N]

OUT is SPEC (seeds, metrics, tuning ...) with its experiments replaced by one per row of
``FOLDER/BENCHMARK-experiments.csv``: the template experiment's methods and settings (SPEC's
experiment NAME, else its first), the ``calarena`` dataset on that (dataset, model) with the
``precomputed`` backbone, ``fit_split: cal``, ``eval_split: test`` and ``n_fit`` 80 % of the
calibration rows (at most the template's ``n_fit``), so every seed draws its own fitting
rows. The file is written whole and then renamed; errors are one line, exit 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml
from selbench.contract.data import DataError

from .calarena import experiments

__all__ = ["main"]


class _NoAliases(yaml.SafeDumper):
    """Every value written out in full (no ``&id001`` anchors for shared lists)."""

    def ignore_aliases(self, data):
        return True


def _experiment(template: dict, folder: str, benchmark: str, row: dict) -> dict:
    exp = {k: v for k, v in template.items() if k not in ("dataset", "backbone", "optional")}
    exp["name"] = f"{benchmark}-{row['dataset']}-{row['model']}"
    exp["dataset"] = {"name": "calarena", "params": {
        "folder": folder, "benchmark": benchmark,
        "dataset": row["dataset"], "model": row["model"]}}
    exp["backbone"] = {"name": "precomputed"}
    exp["fit_split"], exp["eval_split"] = "cal", "test"
    n_fit = max(1, int(0.8 * row["cal_size"]))
    exp["n_fit"] = min(n_fit, template["n_fit"]) if template.get("n_fit") else n_fit
    return exp


def main(argv: list[str] | None = None) -> int:
    """``python -m selbench_plugins.datasets.calarena_spec FOLDER BENCHMARK --like SPEC --out OUT``:
    write OUT, the spec SPEC with one experiment per row of the benchmark's index (the
    methods and settings of SPEC's experiment ``--experiment``, else its first)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m selbench_plugins.datasets.calarena_spec",
                                 description=main.__doc__)
    ap.add_argument("folder")
    ap.add_argument("benchmark")
    ap.add_argument("--like", required=True, help="the spec whose methods and settings to use")
    ap.add_argument("--experiment", help="the template experiment's name (default: the first)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, help="only the first LIMIT rows of the index")
    args = ap.parse_args(argv)
    try:
        rows = experiments(args.folder, args.benchmark)[: args.limit]
        spec = yaml.safe_load(Path(args.like).read_text(encoding="utf-8"))
        if not isinstance(spec, dict):
            raise DataError(f"{args.like}: not a selbench spec (a YAML mapping)")
        exps = spec.get("experiments") or []
        template = next((e for e in exps if e.get("name") == args.experiment), None) \
            if args.experiment else (exps[0] if exps else None)
        if template is None:
            raise DataError(f"{args.like}: no experiment "
                            + (repr(args.experiment) if args.experiment else "at all"))
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, yaml.YAMLError) as exc:
        print(f"error: calarena_spec: {args.like}: {exc}".replace("\n", " "), file=sys.stderr)
        return 2
    folder = str(Path(args.folder).resolve())
    spec["name"] = f"{spec.get('name', 'spec')}-calarena-{args.benchmark}"
    spec["description"] = (f"The methods and settings of {Path(args.like).name} over every "
                           f"(dataset, model) of CalArena's {args.benchmark} benchmark.")
    spec["experiments"] = [_experiment(template, folder, args.benchmark, r) for r in rows]
    out = Path(args.out)
    part = out.with_name(f".{out.name}.part")  # written whole, then renamed: never half a file
    part.write_text(yaml.dump(spec, Dumper=_NoAliases, sort_keys=False), encoding="utf-8")
    os.replace(part, out)
    print(f"wrote {args.out}: {len(rows)} experiments of {args.benchmark}")
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through main() in the tests
    sys.exit(main())
