"""The leaderboard as a web page: ``leaderboard.html``, one self-contained file beside
``leaderboard.md``, ``.csv`` and ``.json``, and an index over several results folders.

The page holds everything it shows: the tables' data as inline JSON (:func:`page_data`, a
compact view of ``leaderboard.json``), its script and style sheet (``html_assets/``, inline),
and the figures as inline SVG: the curves of each metric over the coverage β (mean ± std
over seeds, the data of the run's ``selective-*`` figures) drawn by the page itself, so they
follow its filters, and the critical-difference diagrams the run drew
(``plots/summary/*.svg``, inlined as ``data:`` images). The run's larger figures (the
risk-coverage curves, every method's reliability diagram) are linked where they lie under
``plots/``. A Content-Security-Policy forbids every fetch: it opens offline, from
``file://``, and references no network resource. Identical inputs give identical bytes (no
date of writing, sorted folders).

In the page: each experiment's table (mean ± std over seeds; 95% t-interval, bootstrap
interval and p-value against the best on hover, or under each value with *intervals*),
sortable by any metric (best first on the first press, the registry's direction), methods
filtered by text, scheme, selector or recalibrator, bold = best and not significantly worse
(as the Markdown); across experiments the average ranks, Friedman and Nemenyi tests, the
critical-difference diagrams and win rates with their intervals, and every other entry of
the summary rendered as it comes. The view is in the URL fragment
(``#sort=ece1&dir=asc&filter=joint``), restored on load and updated on every change.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from selbench.measure.metrics import METRICS, metric_info
from selbench.reporting.figures import OKABE_ITO
from selbench.reporting.tuned import tuning_line
from selbench.store.results import slug
from selbench.util.files import atomic_write_text

__all__ = ["PAGE", "metric_help", "page_data", "render_index", "render_page", "write_index",
           "write_page"]

#: the page's file name, beside leaderboard.md / .csv / .json
PAGE = "leaderboard.html"
#: no fetch of any kind: inline script and style, images only from ``data:`` URIs
CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "img-src data:; base-uri 'none'; form-action 'none'")
#: a cell's statistics, in this order, in the page data
STAT_FIELDS = ("mean", "std", "n", "best", "best_mean", "p", "ci_low", "ci_high",
               "boot_low", "boot_high")
_ROW_KEYS = {"method", "metrics", "curves", "extra_metrics", "seeds", "timing"}
_EXP_KEYS = {"name", "report", "betas", "train_beta", "dataset", "backbone", "fit_split",
             "eval_split", "n_fit", "coverage_guarantee", "risk_guarantee", "tuning",
             "shared_fit_rows", "metrics", "bootstrap_level", "rows"}


def _asset(name: str) -> str:
    return resources.files("selbench.reporting").joinpath("html_assets", name).read_text("utf-8")


def _clean(value: Any) -> Any:
    """``value`` ready for JSON.parse: floats to 6 significant digits, NaN and infinities as
    null, tuples as lists, keys as strings."""
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def metric_help(key: str, known: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A column's label, direction and the text its header shows on hover: the registry's
    description (as ``selbench metrics`` prints it), or the leaderboard's copy of it for a
    metric this installation does not register."""
    info = metric_info(key)._asdict() if key in METRICS else dict((known or {}).get(key) or {})
    label = info.get("label") or key
    marked = bool(info.get("marked", info.get("lower_is_better") is not None))
    lower = info.get("lower_is_better") if marked else None
    direction = ("shown, not marked" if lower is None
                 else "lower is better" if lower else "higher is better")
    kind = info.get("kind") or "selective"
    text = f"{label} ({key}): {info.get('summary') or 'no description'}. {direction}; {kind}"
    if kind == "ranking":
        text += " (one value per cell, from the selector's scores over all evaluation examples)"
    return {"label": label, "lower": lower, "kind": kind, "help": text + "."}


def _stat(st: Mapping[str, Any]) -> list[Any]:
    ci = st.get("ci95") or [None, None]
    boot = st.get("bootstrap") or {}
    return [st.get("mean"), st.get("std"), st.get("n"), bool(st.get("best")),
            bool(st.get("best_mean")), st.get("p_vs_best"), ci[0], ci[1],
            boot.get("low_mean"), boot.get("high_mean")]


def _methods_of(spec: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """(experiment, label) -> the method's scheme, selector, recalibrator and loss names, from
    the spec (several specs when folders were combined)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for one in spec if isinstance(spec, list) else [spec]:
        for exp in (one or {}).get("experiments") or []:
            for m in exp.get("methods") or []:
                out.setdefault((exp.get("name"), m.get("label")), {
                    part: (m.get(part) or {}).get("name") if isinstance(m.get(part), dict)
                    else m.get(part) for part in ("scheme", "selector", "recalibrator", "loss")})
    return out


def _figure_links(root: Path, exp: str, method: str | None = None) -> list[list[str]]:
    """[title, relative path] of the run's figure files of an experiment (or of one of its
    methods) under ``root/plots``: SVG where there is one, else PNG."""
    base = root / "plots" / exp
    if method is None:
        stems = sorted({p.stem for p in base.glob("*.svg")} | {p.stem for p in base.glob("*.png")})
        found = [(s.replace("-", " "), base / s) for s in stems]
    else:
        found = [(kind + " diagram" if kind == "reliability" else kind + " histogram",
                  base / kind / slug(method)) for kind in ("reliability", "confidence")]
    links = []
    for title, stem in found:
        for ext in ("svg", "png"):
            if stem.with_suffix("." + ext).is_file():
                links.append([title, f"plots/{stem.relative_to(root / 'plots').as_posix()}.{ext}"])
                break
    return links


def _row(row: Mapping[str, Any], exp: Mapping[str, Any], parts: Mapping, root: Path
         ) -> dict[str, Any]:
    method = row.get("method")
    curves = row.get("curves") or {}
    tuned = ((exp.get("tuning") or {}).get("tuned") or {}).get(method)
    return {
        "method": method,
        **(parts.get((exp.get("name"), method)) or {}),
        "seeds": row.get("seeds") or [],
        "cells": {key: {point: _stat(st) for point, st in (per or {}).items()}
                  for key, per in (row.get("metrics") or {}).items()},
        "curves": {key: [c.get("mean"), c.get("std")] for key, c in curves.items()
                   if isinstance(c, Mapping)},
        **({"tuned": tuned} if tuned else {}),
        "figures": _figure_links(root, str(exp.get("name")), str(method)),
        "extra": {k: v for k, v in row.items() if k not in _ROW_KEYS},
    }


def _notes(exp: Mapping[str, Any]) -> list[str]:
    """The lines the Markdown says under an experiment's heading, in plain text."""
    tb = exp.get("train_beta")
    trained = "one model per β" if tb == "per_beta" else f"selectors trained for β = {tb:g}"
    n_fit = f" ({exp['n_fit']} examples per seed)" if exp.get("n_fit") else ""
    notes = [f"{exp.get('dataset')} / {exp.get('backbone')}: fitted on {exp.get('fit_split')}"
             f"{n_fit}, evaluated on {exp.get('eval_split')}; {trained}."]
    if exp.get("tuning"):
        # the paragraph only: the Markdown table of chosen parameters after it is the
        # tuned badge of each row here
        notes.append(tuning_line(exp["tuning"], tb).split("\n", 1)[0])
    if exp.get("shared_fit_rows"):
        notes.append("Every seed fits the same rows: no significance test; bold marks the best "
                     "mean only.")
    if exp.get("coverage_guarantee"):
        notes.append("Coverage guaranteed with probability ≥ 1 − δ, δ = "
                     f"{exp['coverage_guarantee']['delta']:g} (Hoeffding).")
    if exp.get("risk_guarantee"):
        rg = exp["risk_guarantee"]
        notes.append(f"Selective risk guaranteed ≤ r = {rg['risk']:g} with probability ≥ 1 − δ, "
                     f"δ = {rg['delta']:g} (SGR).")
    if exp.get("report") == "auc" and exp.get("betas"):
        notes.append(f"Values: area under each metric's curve over β ∈ [{min(exp['betas']):g}, "
                     f"{max(exp['betas']):g}], normalised by the range.")
    return notes


def _experiment(exp: Mapping[str, Any], parts: Mapping, root: Path) -> dict[str, Any]:
    rows = exp.get("rows") or []
    points = list(dict.fromkeys(p for r in rows for per in (r.get("metrics") or {}).values()
                                for p in (per or {})))
    return {
        "name": exp.get("name"),
        "report": exp.get("report"),
        "betas": exp.get("betas") or [],
        "train_beta": exp.get("train_beta"),
        "metrics": list(exp.get("metrics") or []),
        "points": points,
        "level": exp.get("bootstrap_level"),
        "notes": _notes(exp),
        "rows": [_row(r, exp, parts, root) for r in rows],
        "figures": _figure_links(root, str(exp.get("name"))),
        "extra": {k: v for k, v in exp.items() if k not in _EXP_KEYS},
    }


def _svg_uri(path: Path) -> str:
    """A figure the run drew as a ``data:`` URI, its metadata and line breaks dropped."""
    text = path.read_text(encoding="utf-8")
    text = text[text.find("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r"\s*\n\s*", " ", text).replace("> <", "><")
    return "data:image/svg+xml," + text.replace("%", "%25").replace("#", "%23")


def page_data(tables: Mapping[str, Any], root: str | Path) -> dict[str, Any]:
    """What the page shows, from a leaderboard's tables (``leaderboard.json``) and the figures
    under ``root/plots``; keys it does not know (in the rows, experiments and summary) are
    carried over and shown as they come."""
    root = Path(root)
    parts = _methods_of(tables.get("spec"))
    experiments = [_experiment(e, parts, root) for e in tables.get("experiments") or []]
    keys = dict.fromkeys(k for e in experiments for k in e["metrics"])
    summary = tables.get("summary")
    for key in (summary or {}).get("metrics") or {}:
        keys.setdefault(key, None)
    cd = {key: _svg_uri(p) for key in (summary or {}).get("metrics") or {}
          if (p := root / "plots" / "summary" / f"critical-difference-{key}.svg").is_file()}
    spec = tables.get("spec")
    return _clean({
        "title": (tables.get("provenance") or {}).get("spec_name") or "leaderboard",
        "description": spec.get("description") if isinstance(spec, Mapping) else None,
        "fields": list(STAT_FIELDS),
        "palette": list(OKABE_ITO),
        "metrics": {k: metric_help(k, tables.get("metrics")) for k in keys},
        "statistics": tables.get("statistics") or {},
        "experiments": experiments,
        "summary": summary,
        "cd": cd,
        "provenance": tables.get("provenance") or {},
    })


def _json_script(data: Any, ident: str) -> str:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c")  # no "</script>" or "<!--" inside the element
    return f'<script type="application/json" id="{ident}">{text}</script>'


def _document(title: str, body: str, data: Any, script: str) -> str:
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="referrer" content="no-referrer">',
        f"<title>{html.escape(title)}</title>", f"<style>\n{_asset('leaderboard.css')}</style>",
        "</head>", "<body>", body, _json_script(data, "lb-data"),
        f"<script>\n{_asset('common.js')}{_asset(script)}</script>", "</body>", "</html>", ""])


def render_page(tables: Mapping[str, Any], root: str | Path = ".") -> str:
    """``leaderboard.html`` of a leaderboard's tables (``root``: the folder the page is
    written to, whose ``plots/`` holds the run's figures)."""
    data = page_data(tables, root)
    body = ("<noscript><p>This page draws its tables with JavaScript; the same numbers are in "
            "leaderboard.md, .csv and .json beside it.</p></noscript>\n"
            '<div id="app" aria-live="polite"></div>')
    return _document(f"Leaderboard: {data['title']}", body, data, "leaderboard.js")


def write_page(out: str | Path, tables: Mapping[str, Any] | None = None) -> Path:
    """Write ``out/leaderboard.html`` (atomically) and return its path; ``tables``: the
    leaderboard's tables (default: read from ``out/leaderboard.json``)."""
    path = Path(out) / PAGE
    if tables is None:
        tables = json.loads((Path(out) / "leaderboard.json").read_text(encoding="utf-8"))
    atomic_write_text(path, render_page(tables, out))
    return path


def _index_entry(folder: Path, site: Path) -> dict[str, Any]:
    tables = json.loads((folder / "leaderboard.json").read_text(encoding="utf-8"))
    prov = tables.get("provenance") or {}
    spec = tables.get("spec")
    exps = tables.get("experiments") or []
    return {
        "href": Path(os.path.relpath(folder / PAGE, site)).as_posix(),
        "folder": folder.name,
        "title": prov.get("spec_name") or folder.name,
        "description": spec.get("description") if isinstance(spec, Mapping) else None,
        "experiments": [[e.get("name"), len(e.get("rows") or [])] for e in exps],
        "seeds": prov.get("seeds") or [],
        "spec_hash": prov.get("spec_hash"),
        "selbench": prov.get("selbench"),
        "date": prov.get("date"),
    }


def render_index(folders: Sequence[str | Path], site: str | Path) -> str:
    """``index.html`` for ``site``: a link to each folder's ``leaderboard.html`` (relative, so
    the site opens from ``file://`` as long as the folders stay where they are)."""
    site = Path(site).resolve()
    entries = [_index_entry(Path(f).resolve(), site) for f in folders]
    return _document("selbench leaderboards", '<div id="app" aria-live="polite"></div>',
                     _clean({"index": entries}), "index.js")


def write_index(folders: Sequence[str | Path], site: str | Path) -> Path:
    """Write ``site/index.html`` over the folders' pages (each already written)."""
    site = Path(site)
    site.mkdir(parents=True, exist_ok=True)
    path = site / "index.html"
    atomic_write_text(path, render_index(folders, site))
    return path
