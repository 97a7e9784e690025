"""What makes a result reusable: the keys of a run's cells and cached backbone outputs.

:func:`identify` digests every declared input file and the code of every plugin a spec uses
(:class:`Identity`); :func:`output_keys` keys an experiment's backbone outputs on them, and
:func:`plan_cells` lists every cell of the spec (:class:`Cell`: one method × seed × training
β) with the content key that decides whether its finished record is reused —
:func:`why_recomputed` says in one line why one is not. :func:`method_params` and
:func:`method_fields` read a spec's method as the estimator's parameters and its plugin
fields; :func:`provenance` is what a run records beside its cells (versions, configuration,
machine).
"""

from __future__ import annotations

import platform
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from selbench.contract.inputs import DigestCache, InputError, digest_input
from selbench.execution.codeid import code_digest, core_digest
from selbench.execution.tuning import tuning_components
from selbench.measure.metrics import METRICS
from selbench.spec import (
    METHOD_FIELDS,
    Component,
    ExperimentSpec,
    MethodSpec,
    ResolvedSpec,
    SpecError,
    content_hash,
)
from selbench.store.cache import OutputCache
from selbench.store.results import CELL_SCHEMA, LEGACY, CellCheck, ResultsDir
from selbench.util.version import __version__

__all__ = ["Cell", "Identity", "identify", "method_fields", "method_params", "output_keys",
           "plan_cells", "provenance", "why_recomputed"]


def provenance(resolved: ResolvedSpec, device: str) -> dict[str, Any]:
    """Versions, configuration and machine: what a reader needs to trust a number."""
    import torch

    return {
        "selbench": __version__,
        "plugins": resolved.registry.packages(),
        "plugin_versions": _plugin_versions(resolved),
        "spec_name": resolved.spec.name,
        "spec_hash": resolved.hash(),
        "spec_source": resolved.source,
        "seeds": list(resolved.spec.seeds),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor()
        or platform.machine(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        **hardware(),
        "git_commit": _git_commit(),
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def hardware() -> dict[str, Any]:
    """What decides the last digits besides the library versions: the CPU model, the
    instruction set torch's kernels use (``torch.backends.cpu.get_cpu_capability()``: e.g.
    AVX2, AVX512), torch's CPU threads and whether torch is a CUDA build. ``selbench compare``
    names each that differs between two leaderboards."""
    import torch

    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return {
        "cpu": _cpu_model(),
        "cpu_capability": capability() if capability else None,
        "threads": torch.get_num_threads(),
        "torch_cuda_build": torch.version.cuda,
    }


def _plugin_versions(resolved: ResolvedSpec) -> dict[str, dict[str, str | None]]:
    """``kind/name`` -> provider and version, for every plugin the spec uses."""
    used: dict[str, dict[str, str | None]] = {}
    for exp in resolved.spec.experiments:
        comps = [("dataset", exp.dataset), ("backbone", exp.backbone)]
        for m in exp.methods:
            comps += [("scheme", m.scheme), ("selector", m.selector), ("recalibrator", m.recalibrator)]
            comps += [("loss", c) for c in (m.loss, m.coverage) if c is not None]
        for kind, comp in comps:
            reg = resolved.registry.get(kind, comp.name)
            used[f"{kind}/{comp.name}"] = {"provider": reg.package_name,
                                           "version": reg.plugin.version}
    return dict(sorted(used.items()))


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return None
    dirty = subprocess.run(
        ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, timeout=5, check=False,
    ).stdout.strip()
    return commit + ("-dirty" if dirty else "")


@dataclass
class Identity:
    """The content that keys a run's cached outputs and cells: input digests and code
    digests of every plugin the spec uses, and the core's digest."""

    inputs: dict[str, dict[str, str | None]]  # "experiments[0].dataset.params.path" -> {path, digest}
    code: dict[str, str]  # "kind/name" -> code digest
    core: str

    def component_params(self, resolved: ResolvedSpec, kind: str, comp: Component,
                         where: str) -> dict:
        """The component's canonical params with each input path replaced by its digest:
        what a key hashes (moving a file keeps its results; rewriting it does not)."""
        params = resolved.params(kind, comp)
        for pname in resolved.inputs(kind, comp):
            params[pname] = {"input": self.inputs[f"{where}.params.{pname}"]["digest"]}
        return {"name": comp.name, "params": params}


def _components_of(exp: ExperimentSpec, e_i: int):
    """(kind, field, component, yaml path) of everything an experiment uses."""
    yield "dataset", "dataset", exp.dataset, f"experiments[{e_i}].dataset"
    yield "backbone", "backbone", exp.backbone, f"experiments[{e_i}].backbone"
    for m_i, m in enumerate(exp.methods):
        for kind, attr in METHOD_FIELDS:
            comp = getattr(m, attr)
            if comp is not None:
                yield kind, attr, comp, f"experiments[{e_i}].methods[{m_i}].{attr}"


def method_fields(method: MethodSpec):
    """(kind, field, component) of each plugin a method uses (absent losses left out):
    :meth:`MethodSpec.components <selbench.spec.MethodSpec.components>`."""
    return method.components()


def identify(resolved: ResolvedSpec, cache: OutputCache) -> Identity:
    """Digest every declared input and the code of every plugin the spec uses."""
    digests = DigestCache(cache.root)
    inputs: dict[str, dict[str, str | None]] = {}
    code: dict[str, str] = {}
    for e_i, exp in enumerate(resolved.spec.experiments):
        for kind, _, comp, where in _components_of(exp, e_i):
            for pname, (path, ispec) in resolved.inputs(kind, comp).items():
                try:
                    digest = digest_input(path, ispec, digests)
                except InputError as exc:
                    raise SpecError([f"{where}.params.{pname}: {exc}"], resolved.source) from None
                inputs[f"{where}.params.{pname}"] = {"path": path, "digest": digest}
            reg = resolved.registry.get(kind, comp.name)
            code[f"{kind}/{comp.name}"] = code_digest(reg.plugin.factory)
    return Identity(dict(sorted(inputs.items())), dict(sorted(code.items())), core_digest())


def output_keys(resolved: ResolvedSpec, ident: Identity, e_i: int) -> dict[str, tuple[str, dict]]:
    """split -> (cache key, key material) of an experiment's backbone outputs."""
    exp = resolved.spec.experiments[e_i]
    base = f"experiments[{e_i}]"
    dataset = ident.component_params(resolved, "dataset", exp.dataset, f"{base}.dataset")
    backbone = ident.component_params(resolved, "backbone", exp.backbone, f"{base}.backbone")
    code = {"dataset": ident.code[f"dataset/{exp.dataset.name}"],
            "backbone": ident.code[f"backbone/{exp.backbone.name}"]}
    out = {}
    for split in dict.fromkeys([exp.fit_split, exp.eval_split]):
        material = OutputCache.key_material(dataset, backbone, split, code)
        out[split] = (content_hash(material), material)
    return out


@dataclass
class Cell:
    e_i: int
    m_i: int
    seed: int
    train_beta: float
    eval_betas: list[float]
    key: str
    path: Path
    components: dict[str, Any]
    needs_arrays: bool


def plan_cells(resolved: ResolvedSpec, results: ResultsDir, ident: Identity) -> list[Cell]:
    """Every cell of the spec, each with the content key that decides whether it is reused.

    The key hashes the experiment's settings, the keys of its backbone outputs (which hold
    the input digests), the method's configuration, the code digest of each plugin the
    method uses, the core's digest, the seed and the β's.
    """
    cells: list[Cell] = []
    first_seed = resolved.spec.seeds[0]
    for e_i, exp in enumerate(resolved.spec.experiments):
        base = f"experiments[{e_i}]"
        # the leaderboard columns (metrics) are a view: every cell holds every registered metric
        settings = exp.model_dump(mode="json", exclude={"methods", "report", "metrics", "dataset",
                                                        "backbone", "tuning"})  # tuning: per method
        if settings.get("risk_guarantee", 0) is None:  # unset: the settings hash it had
            del settings["risk_guarantee"]
        outputs = {split: key for split, (key, _) in output_keys(resolved, ident, e_i).items()}
        exp_part = {"settings": content_hash(settings), "outputs": outputs}
        # metrics of the recalibrated distribution are computed only where shown: keyed
        distribution = sorted(k for k in exp.metrics or () if METRICS[k].needs == "log_probs")
        for m_i, method in enumerate(exp.methods):
            mwhere = f"{base}.methods[{m_i}]"
            config = {attr: ident.component_params(resolved, kind, comp, f"{mwhere}.{attr}")
                      for kind, attr, comp in method_fields(method)}
            code = {attr: ident.code[f"{kind}/{comp.name}"]
                    for kind, attr, comp in method_fields(method)}
            tuning = tuning_components(resolved, exp, method)
            per_beta = exp.train_beta == "per_beta"
            train_betas = list(exp.betas) if per_beta else [float(exp.train_beta)]
            for seed in resolved.spec.seeds:
                for tb in train_betas:
                    eval_betas = [tb] if per_beta else list(exp.betas)
                    components = {
                        "schema": CELL_SCHEMA,
                        "experiment": exp_part,
                        "method": content_hash(config),
                        "code": code,
                        "core": ident.core,
                        "seed": seed,
                        "train_beta": tb,
                        "eval_betas": eval_betas,
                        "names": {attr: f"{kind} {comp.name!r}"
                                  for kind, attr, comp in method_fields(method)},
                    }
                    if tuning is not None:  # tuned and untuned results never mix
                        components["tuning"] = tuning
                        # refused now (exit 2, before any fit) when a link is on its way
                        results.journal_path(exp.name, method.label, seed)
                    if distribution:  # only then: the keys of other cells stay as they were
                        components["distribution_metrics"] = distribution
                    key = content_hash({k: v for k, v in components.items() if k != "names"})
                    path = results.cell_path(exp.name, method.label, seed,
                                             tb if per_beta else None)
                    cells.append(Cell(e_i, m_i, seed, tb, eval_betas, key, path, components,
                                      seed == first_seed))
    return cells


def why_recomputed(cell: Cell, check: CellCheck) -> str:
    """One short reason a finished cell is not reused."""
    prev = check.previous
    if check.problem == LEGACY:
        return LEGACY
    if prev is None:
        return f"cell file {check.problem}"
    old, new = prev.components, cell.components
    if not old:
        return LEGACY
    if old.get("core") != new["core"]:
        return "selbench's metric definitions changed"
    changed = [new["names"][attr] for attr in new["code"]
               if (old.get("code") or {}).get(attr) != new["code"][attr]]
    if changed:
        return ", ".join(changed) + " changed"
    if old.get("experiment", {}).get("outputs") != new["experiment"]["outputs"]:
        return "the backbone outputs changed (dataset, backbone, their code or input files)"
    if old.get("experiment") != new["experiment"]:
        return "the experiment's settings changed"
    if old.get("method") != new["method"]:
        return "the method's parameters changed"
    if old.get("tuning") != new.get("tuning"):
        return "its tuning (block, search space or procedure) changed"
    return "its configuration changed"


def method_params(resolved: ResolvedSpec, method: MethodSpec) -> dict[str, Any]:
    """A spec's method as :class:`~selbench.library.estimator.SelectiveRecalibrator` parameters
    (:meth:`ResolvedSpec.method_params <selbench.spec.ResolvedSpec.method_params>`)."""
    return resolved.method_params(method)
