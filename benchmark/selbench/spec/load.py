"""Loading a spec: :func:`load_spec` reads it (:mod:`selbench.spec.yamlio`), applies the
overrides (:mod:`selbench.spec.overrides`), validates its structure
(:mod:`selbench.spec.model`), finds every component's plugin and validates its params, checks
the capabilities (:mod:`selbench.spec.capabilities`) and the declared input files (present,
then opened by the plugins that declare ``check_inputs``; the split names and ``n_fit``
where the dataset declares ``split_sizes``), and leaves out the optional experiments that
cannot run.
"""

from __future__ import annotations

import copy
from pathlib import Path

from pydantic import BaseModel, ValidationError

from selbench.contract.api import CoverageLoss, SelectionLoss
from selbench.contract.inputs import check_exists
from selbench.contract.registry import (
    PluginError,
    Registered,
    Registry,
    format_validation_error,
    get_registry,
)
from selbench.spec.capabilities import (
    check_data,
    check_distribution_metrics,
    check_inputs_kind,
    check_method,
    check_tuning_objective,
)
from selbench.spec.model import (
    METHOD_FIELDS,
    Component,
    ExperimentSpec,
    MethodSpec,
    ResolvedSpec,
    Spec,
    SpecError,
    params_key,
)
from selbench.spec.overrides import apply_overrides
from selbench.spec.search import check_search
from selbench.spec.yamlio import read_yaml, shape_problem


def load_spec(
    source: str | Path | dict,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    registry: Registry | None = None,
    optional: bool = True,
) -> ResolvedSpec:
    """Read, validate and resolve a spec (path or dict); raises :class:`SpecError`.

    An experiment marked ``optional: true`` is left out of the resolved spec (its canonical
    form, hash and cells), and listed in :attr:`ResolvedSpec.skipped` with the reason, when
    one of the input files or folders it declares is missing, or always with
    ``optional=False``. Experiments keep their names; the indices in later messages
    (``experiments[i]``) count the experiments that are kept.
    """
    label = None if isinstance(source, dict) else str(source)
    raw, spec = _read(source, overrides, label)
    registry = registry or get_registry()
    errors, validated = _check_components(registry, spec)
    if errors:
        raise SpecError(errors, label)
    resolved = ResolvedSpec(spec, registry, raw, label, validated=validated)
    keep, skipped, errors = _available(resolved, optional)
    if errors:
        raise SpecError(sorted(set(errors), key=errors.index), label)
    if not keep:
        raise SpecError(["experiments: every experiment is optional and skipped ("
                         + "; ".join(f"{name}: {why}" for name, why in skipped) + ")"], label)
    if skipped:  # the spec without them: its canonical form, hash and cells leave them out
        spec = spec.model_copy(update={"experiments": [spec.experiments[i] for i in keep]})
        raw = {**raw, "experiments": [raw["experiments"][i] for i in keep]}
        resolved = ResolvedSpec(spec, registry, raw, label, validated=validated)
    resolved.skipped = skipped
    return resolved


def _read(source: str | Path | dict, overrides: list[str] | tuple[str, ...],
          label: str | None) -> tuple[dict, Spec]:
    """The raw spec (read, overridden, a copy when given a dict) and its structure."""
    raw = source if isinstance(source, dict) else read_yaml(source)
    problem = shape_problem(raw)
    if problem is None and overrides:
        raw = apply_overrides(raw, overrides)
        problem = shape_problem(raw)
    if problem is not None:
        raise SpecError([problem], label)
    if raw is source:
        raw = copy.deepcopy(source)
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, "", Spec), label) from None
    return raw, spec


def _check_components(registry: Registry,
                      spec: Spec) -> tuple[list[str], dict[tuple[str, str, str], BaseModel]]:
    """Every component's plugin and params, and the capabilities of each combination: the
    problems found, and the validated params (keyed as :func:`params_key`)."""
    errors: list[str] = []
    validated: dict[tuple[str, str, str], BaseModel] = {}
    for e_i, exp in enumerate(spec.experiments):
        base = f"experiments[{e_i}]"
        dataset = _check_component(registry, "dataset", exp.dataset, f"{base}.dataset",
                                   errors, validated)
        backbone = _check_component(registry, "backbone", exp.backbone, f"{base}.backbone",
                                    errors, validated)
        if dataset is not None and backbone is not None:
            check_inputs_kind(registry, dataset, backbone, f"{base}.backbone", errors)
        for m_i, m in enumerate(exp.methods):
            _check_method_components(registry, m, f"{base}.methods[{m_i}]", errors, validated)
        check_distribution_metrics(registry, exp, base, errors)
        check_tuning_objective(registry, exp, base, errors)
    return errors, validated


def _check_method_components(registry: Registry, m: MethodSpec, mbase: str,
                             errors: list[str], validated: dict) -> None:
    """A method's components (a ``loss`` must be a selection loss, a ``coverage`` a coverage
    loss), then their capabilities (:func:`check_method`)."""
    regs: dict[str, Registered | None] = {}
    for kind, field in METHOD_FIELDS:
        comp = getattr(m, field)
        if comp is None:
            continue
        reg = regs[field] = _check_component(registry, kind, comp, f"{mbase}.{field}",
                                             errors, validated)
        if reg is not None and field in ("loss", "coverage"):
            want = SelectionLoss if field == "loss" else CoverageLoss
            factory = reg.plugin.factory
            if isinstance(factory, type) and not issubclass(factory, want):
                regs[field] = None  # not checked against the scheme below
                errors.append(
                    f"{mbase}.{field}.name: {comp.name!r} is a "
                    f"{'coverage' if field == 'loss' else 'selection'} loss; "
                    f"`{field}` expects a {want.__name__}"
                )
    check_method(registry, m, regs, mbase, errors)
    check_search(registry, m, mbase, errors)


def _check_component(registry: Registry, kind: str, comp: Component, path: str,
                     errors: list[str], validated: dict) -> Registered | None:
    """Find the component's plugin and validate its params (kept in ``validated``)."""
    try:
        reg = registry.get(kind, comp.name)
    except PluginError as exc:
        errors.append(f"{path}.name: {exc}")
        return None
    key = params_key(kind, comp)
    if key not in validated:
        try:
            validated[key] = reg.validate_params(comp.params)
        except ValidationError as exc:
            errors.extend(format_validation_error(exc, f"{path}.params", reg.plugin.params))
    return reg


def _available(resolved: ResolvedSpec,
               optional: bool) -> tuple[list[int], list[tuple[str, str]], list[str]]:
    """The indices of the experiments kept, the (name, why) of the optional ones left out,
    and the missing inputs of the kept ones (problems)."""
    skipped: list[tuple[str, str]] = []
    keep: list[int] = []
    errors: list[str] = []
    for e_i, exp in enumerate(resolved.spec.experiments):
        if exp.optional and not optional:
            skipped.append((exp.name, "optional, left out by --no-optional"))
            continue
        missing = _missing_inputs(resolved, exp, f"experiments[{e_i}]")
        if missing and exp.optional:
            skipped.append((exp.name, f"optional, skipped: {missing[0]}"))
        else:
            # the inputs present are opened enough to catch what a run would reject
            errors.extend(missing or check_data(resolved, exp, f"experiments[{e_i}]"))
            keep.append(e_i)
    return keep, skipped, errors


def _missing_inputs(resolved: ResolvedSpec, exp: ExperimentSpec, base: str) -> list[str]:
    """``path: problem`` for each input file or folder the experiment declares that is
    missing (or exists but is not what it should be)."""
    comps = [("dataset", "dataset", exp.dataset), ("backbone", "backbone", exp.backbone)]
    for m_i, m in enumerate(exp.methods):
        comps += [(kind, f"methods[{m_i}].{field}", getattr(m, field))
                  for kind, field in METHOD_FIELDS if getattr(m, field) is not None]
    missing: list[str] = []
    for kind, where, comp in comps:
        for pname, (path, ispec) in resolved.inputs(kind, comp).items():
            problem = check_exists(path, ispec)
            if problem is not None and (ispec.must_exist or Path(path).exists()):
                missing.append(f"{base}.{where}.params.{pname}: {problem}")
    return missing
