"""``selbench`` command line: run, validate, plugins, metrics, leaderboard, plot, rank.

Exit codes: 0 success, 1 a run failed (a plugin or the data misbehaved), 2 bad input
(malformed spec, unknown plugin, bad arguments).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from selbench.util.version import __version__

EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def _err(msg: str) -> None:
    print(f"selbench: error: {msg}", file=sys.stderr)


def cmd_validate(args: argparse.Namespace) -> int:
    from selbench.spec import load_spec

    resolved = load_spec(args.spec, overrides=args.set or [], optional=not args.no_optional)
    for name, why in resolved.skipped:
        print(f"selbench: experiment {name!r} {why}", file=sys.stderr)
    n_cells = 0
    for exp in resolved.spec.experiments:
        per = len(exp.betas) if exp.train_beta == "per_beta" else 1
        n_cells += len(exp.methods) * len(resolved.spec.seeds) * per
    print(
        f"{args.spec}: valid (spec {resolved.spec.name!r}, {len(resolved.spec.experiments)} "
        f"experiment(s), {n_cells} cells, hash {resolved.hash()[:12]})"
    )
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from selbench.execution.runner import run

    report = run(
        args.spec,
        out_dir=args.out,
        device=args.device,
        overrides=args.set or [],
        cache_dir=args.cache_dir,
        progress=not args.no_progress,
        plots=not args.no_plots,
        force=args.force or bool(args.only),
        only=args.only or [],
        optional=not args.no_optional,
        executor=args.executor,
        workers=args.workers,
        retries=args.retries,
    )
    md = report.out_dir / "leaderboard.md"
    if not args.quiet:
        print(md.read_text())
    print(
        f"{report.computed} cell(s) computed, {report.reused} reused; results in {report.out_dir}/ "
        f"(leaderboard.md, .csv, .json, .html)",
        file=sys.stderr,
    )
    return EXIT_OK


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from selbench.reporting.leaderboard import write_leaderboard

    if args.html is not None:
        return _leaderboard_site(args)
    paths = write_leaderboard(args.results_dir, out=args.out, allow_partial=args.allow_partial,
                              allow_mixed=args.allow_mixed)
    if not args.quiet:
        print(paths[0].read_text())
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return EXIT_OK


def _leaderboard_site(args: argparse.Namespace) -> int:
    """``--html SITE``: each results folder's leaderboard on its own, and ``SITE/index.html``
    linking their pages."""
    from selbench.reporting.html import write_index
    from selbench.reporting.leaderboard import write_leaderboard

    if args.out is not None:
        _err("--html renders each results directory on its own (in that directory) and "
             "--out combines them into one: use one of the two")
        return EXIT_BAD_INPUT
    paths = [p for d in args.results_dir
             for p in write_leaderboard(d, allow_partial=args.allow_partial,
                                        allow_mixed=args.allow_mixed)]
    paths.append(write_index(args.results_dir, args.html))
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return EXIT_OK


def cmd_rank(args: argparse.Namespace) -> int:
    from selbench.reporting.rankfolders import (
        RankingInputError,
        rank_folders,
        render_ranking,
        write_ranking,
    )

    try:
        summary = rank_folders(args.results_dir, allow_partial=args.allow_partial,
                               metrics=args.metric)
    except RankingInputError as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    print(render_ranking(summary), end="")
    if args.out is not None:
        paths = write_ranking(summary, args.out)
        print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from selbench.reporting.compare import compare, render_comparison

    result = compare(args.a, args.b, level=args.level, atol=args.atol, rtol=args.rtol)
    print(render_comparison(result))
    return EXIT_OK if result.agree else EXIT_RUN_FAILED


def cmd_plot(args: argparse.Namespace) -> int:
    from selbench.reporting.plots import write_plots

    try:
        paths = write_plots(args.results_dir, out=args.out, allow_partial=args.allow_partial,
                            allow_mixed=args.allow_mixed, beta=args.beta, formats=args.format)
    except ValueError as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    folders = sorted({str(p.parent) for p in paths})
    print(f"wrote {len(paths)} figure file(s) in " + ", ".join(folders), file=sys.stderr)
    out = args.out or args.results_dir[0]
    if (out / "leaderboard.json").is_file():  # the page shows the figures: redraw it too
        from selbench.reporting.html import write_page

        print(f"wrote {write_page(out)}", file=sys.stderr)
    return EXIT_OK


def _add_combine_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("results_dir", type=Path, nargs="+",
                   help="results directory written by `selbench run`; several are combined")
    p.add_argument("--out", type=Path, default=None,
                   help=f"where to write the {what} (default: the results directory; "
                        "required with several)")
    p.add_argument("--allow-partial", action="store_true", help="render even if cells are missing")
    p.add_argument("--allow-mixed", action="store_true",
                   help="combine results computed for different specs (spec hashes) in one table")


def cmd_plugins(args: argparse.Namespace) -> int:
    from selbench.contract.api import KINDS
    from selbench.contract.inputs import declared_inputs
    from selbench.contract.registry import get_registry

    reg = get_registry()
    kinds = [args.kind] if args.kind else list(KINDS)
    for kind in kinds:
        entries = reg.all(kind)
        print(f"{kind} ({len(entries)})")
        for entry in entries:
            plugin = entry.plugin
            print(f"  {plugin.name:<20} {plugin.describe()}  [{entry.package_name}]")
            ref = plugin.reference()
            if ref:
                print(f"      reference: {ref}")
            inputs = declared_inputs(plugin.params)
            space = entry.search_space()
            for fname, finfo in plugin.params.model_fields.items():
                default = "required" if finfo.is_required() else f"default {finfo.get_default(call_default_factory=True)!r}"
                ann = _type_name(finfo.annotation)
                if fname in inputs:  # a path the core resolves, checks and hashes
                    ann = "input " + ("file" if inputs[fname].kind == "file" else "folder")
                    if not finfo.is_required() and finfo.get_default() is None:
                        ann += " | None"
                desc = f" — {finfo.description}" if finfo.description else ""
                tune = f"; tuned over {space[fname].describe()}" if fname in space else ""
                print(f"      {fname}: {ann} ({default}{tune}){desc}")
        print()
    return EXIT_OK


def cmd_metrics(args: argparse.Namespace) -> int:
    from selbench.measure.metrics import DEFAULT_COLUMNS, METRICS

    print(f"metrics ({len(METRICS)}); a spec's `metrics: [...]` picks the leaderboard columns "
          f"(default: {', '.join(DEFAULT_COLUMNS)})")
    for key, info in METRICS.items():
        direction = ("lower is better" if info.lower_is_better else "higher is better") \
            if info.marked else "shown, not marked"
        needs = f"; needs {info.needs}" if info.needs else ""
        print(f"  {key:<20} {info.label:<16} {info.kind:<9} {direction}{needs}")
        print(f"      {info.summary}")
    return EXIT_OK


def _type_name(annotation) -> str:
    """``int``, ``list[int]``, ``Literal['a', 'b']``, ``int | None`` ... for parameter listings."""
    if getattr(annotation, "__args__", None) is None and hasattr(annotation, "__name__"):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("NoneType", "None")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="selbench",
        description="Benchmark selective recalibration methods from a YAML spec.",
    )
    parser.add_argument("--version", action="version", version=f"selbench {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(sub)
    _add_validate(sub)
    _add_listings(sub)
    _add_leaderboard(sub)
    _add_compare(sub)
    _add_plot(sub)
    _add_rank(sub)
    return parser


_NO_OPTIONAL_HELP = ("leave out the experiments marked `optional: true` (by default they "
                     "run when their input files are present, else are skipped with a line)")


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a spec and write its leaderboard")
    p.add_argument("spec", type=Path, help="YAML spec, e.g. specs/quickstart.yaml")
    p.add_argument("--out", type=Path, default=None, help="results directory (default results/<spec name>)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None,
                   help="compute device (default: the spec's, normally auto = cuda if present)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a spec value, e.g. --set seeds=[0,1] --set experiments[0].n_fit=200")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="backbone-output cache (default $SELBENCH_CACHE_DIR or ~/.cache/selbench)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--no-plots", action="store_true", help="do not draw the figures (plots/)")
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the leaderboard")
    p.add_argument("--force", action="store_true",
                   help="recompute every cell (with --only: every cell of those methods)")
    p.add_argument("--only", nargs="+", metavar="LABEL",
                   help="with or without --force: recompute the cells of these method labels")
    p.add_argument("--no-optional", action="store_true", help=_NO_OPTIONAL_HELP)
    _add_executor_options(p)
    p.set_defaults(func=cmd_run)


def _add_executor_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executor", default=None, metavar="NAME",
                   help="where the cells are computed: inline (default: in this process), "
                        "local (a process pool, --workers N) or submitit (Slurm through "
                        "submitit; pip install 'selbench[cluster]'); default the spec's "
                        "`executor:` block. Every executor gives the same leaderboard")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes of --executor local (default: one per visible GPU "
                        "when there are several, else one per CPU core)")
    p.add_argument("--retries", type=int, default=None, metavar="N",
                   help="resubmit a failed job up to N times (local and submitit executors)")


def _add_validate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate", help="check a spec (structure, plugins, parameters) without running",
        description="Check a spec without computing anything: its YAML, structure and keys, "
                    "every plugin and parameter, the combinations' capabilities, and every "
                    "declared input file (opened enough to catch what `run` would reject, "
                    "e.g. a damaged .npz, or an n_fit larger than its split where the split "
                    "size is known without running a backbone). Exit 0 when valid, 2 with one "
                    "line per problem otherwise.")
    p.add_argument("spec", type=Path, help="YAML spec, e.g. specs/quickstart.yaml")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a spec value before checking, as for `run`, e.g. "
                        "--set seeds=[0,1] --set experiments[0].n_fit=200")
    p.add_argument("--no-optional", action="store_true", help=_NO_OPTIONAL_HELP)
    p.set_defaults(func=cmd_validate)


def _add_listings(sub: argparse._SubParsersAction) -> None:
    """``plugins`` and ``metrics``: what is installed and registered."""
    p = sub.add_parser(
        "plugins", help="list plugins with their summaries and parameters",
        description="List every installed plugin (the built-ins and third-party packages "
                    "registered under the `selbench` entry point), by kind: its name, summary, "
                    "reference and providing package, then each parameter with its type, "
                    "default, tuning space and description, as a spec's `params:` takes them.")
    p.add_argument("kind", nargs="?", choices=["dataset", "backbone", "selector", "recalibrator",
                                               "loss", "scheme"],
                   help="list only this kind (default: all six)")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser(
        "metrics", help="list the registered metrics (leaderboard columns)",
        description="List every metric of the registry (selbench.metrics.METRICS): its key "
                    "(what a spec's `metrics: [...]` names), label, kind (per coverage β or of "
                    "the selector's ranking), whether lower or higher is better, what it "
                    "needs, and a one-line definition; the first line names the default columns.")
    p.set_defaults(func=cmd_metrics)


def _add_leaderboard(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("leaderboard", help="re-render the leaderboard of a results directory")
    _add_combine_options(p, "leaderboard")
    p.add_argument("--html", type=Path, default=None, metavar="SITE",
                   help="render each results directory's leaderboard on its own (not "
                        "combined) and write SITE/index.html linking their pages "
                        "(leaderboard.html, also written without --html)")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_leaderboard)


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="do two leaderboards agree within their noise? (exit 0 yes, 1 no)",
        description="Compare two leaderboards (results folders, leaderboard folders, or their "
                    "leaderboard.json / leaderboard.csv): every number where they differ beyond "
                    "the seed-to-seed and bootstrap noise it carries, and what differs in their "
                    "provenance. Exit 0 when they agree, 1 when they differ, 2 on bad input.")
    p.add_argument("a", help="the first leaderboard (e.g. a committed one: leaderboards/quickstart)")
    p.add_argument("b", help="the second leaderboard (e.g. a fresh run: results/quickstart)")
    p.add_argument("--level", type=float, default=0.95,
                   help="confidence of the noise band (default 0.95: 1.96 standard errors)")
    p.add_argument("--rtol", type=float, default=1e-5,
                   help="relative float-rounding tolerance (default 1e-5)")
    p.add_argument("--atol", type=float, default=1e-9,
                   help="absolute float-rounding tolerance (default 1e-9)")
    p.set_defaults(func=cmd_compare)


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw the figures of a results directory into its plots/")
    _add_combine_options(p, "plots/ folder")
    p.add_argument("--beta", type=float, default=None,
                   help="coverage of the reliability diagrams and histograms "
                        "(default: the training β, or the β closest to 0.8)")
    p.add_argument("--format", nargs="+", default=["png", "svg"], metavar="FMT",
                   help="file formats (default: png svg)")
    p.set_defaults(func=cmd_plot)


def _add_rank(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rank", help="rank the methods over every experiment of any results folders",
        description="Average ranks, the Friedman test, Nemenyi's critical difference and win "
                    "rates of the methods over every experiment of the results folders given "
                    "(any specs: methods are matched by label; a same-named experiment or "
                    "same-labelled method whose configuration differs between folders is kept "
                    "apart as 'name (folder)', with a warning), printed as Markdown: the "
                    "'Across experiments' section `selbench leaderboard DIR... --allow-mixed` "
                    "writes. The diagrams: `selbench plot DIR... --allow-mixed --out DIR`.")
    p.add_argument("results_dir", type=Path, nargs="+",
                   help="results directories written by `selbench run` (two or more "
                        "experiments in all)")
    p.add_argument("--metric", nargs="+", metavar="KEY", default=None,
                   help="rank only by these metrics (default: every metric with a direction "
                        "that every experiment shows)")
    p.add_argument("--out", type=Path, default=None,
                   help="also write ranking.md and ranking.json into this folder")
    p.add_argument("--allow-partial", action="store_true",
                   help="rank the finished cells when some are missing")
    p.set_defaults(func=cmd_rank)


def _bad_input_types() -> tuple[type[BaseException], ...]:
    from selbench.contract.inputs import InputError
    from selbench.contract.registry import PluginError
    from selbench.execution.executors import ExecutorError
    from selbench.reporting.compare import CompareError
    from selbench.spec import SpecError
    from selbench.store.cache import CacheError
    from selbench.store.results import ResultsError
    from selbench.training.devices import DeviceError

    return (SpecError, PluginError, ResultsError, CacheError, InputError, ExecutorError,
            DeviceError, CompareError)


def _failed_run_types() -> tuple[type[BaseException], ...]:
    from selbench.contract.data import DataError
    from selbench.execution.errors import RunError
    from selbench.reporting.loading import LeaderboardError

    return (RunError, DataError, LeaderboardError)


def _os_message(exc: OSError) -> str:
    from selbench.util.files import WriteError

    if isinstance(exc, WriteError):
        return str(exc)
    if exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc.strerror or exc)


def main(argv: list[str] | None = None) -> int:
    """Entry point: one ``selbench: error:`` line and exit 2 (bad input) or 1 (a failed
    run) for every error, whatever raised it; ``--debug`` adds the traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv  # accepted anywhere on the line
    try:
        args = build_parser().parse_args([a for a in argv if a != "--debug"])
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    from selbench.util.warnlines import warning_lines

    try:
        with warning_lines():  # "selbench: warning: ..." lines, once each
            return args.func(args)
    except KeyboardInterrupt:
        _err("interrupted; finished cells are saved, rerun the same command to resume")
        return 130
    except BaseException as exc:  # the one place every error becomes a line
        if debug:
            import traceback

            traceback.print_exception(exc)
        bad_input, failed = _bad_input_types(), _failed_run_types()
        if isinstance(exc, bad_input):
            _err(str(exc))
            return EXIT_BAD_INPUT
        if isinstance(exc, failed):
            _err(str(exc))
            return EXIT_RUN_FAILED
        if isinstance(exc, OSError):
            _err(_os_message(exc))
            return EXIT_RUN_FAILED
        if isinstance(exc, SystemExit):
            _err(f"a plugin called sys.exit({exc.code!r}); rerun with --debug for the traceback")
            return EXIT_RUN_FAILED
        _err(f"unexpected {type(exc).__name__}: {exc} (a bug: rerun with --debug and report "
             "the traceback)")
        return EXIT_RUN_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
