"""The capability checks of a spec: what the plugins of a method or an experiment declare
about each other (see the table in :mod:`selbench.contract.api`), read from each factory
class: a scheme's required losses and selector/recalibrator kinds (:func:`check_method`),
the dataset inputs a backbone reads (:func:`check_inputs_kind`), and the data an experiment
declares (:func:`check_data`: each plugin's ``check_inputs`` hook opens its input files, a
dataset's ``split_sizes`` checks the split names and ``n_fit``). Nothing here depends on a
plugin's name.
"""

from __future__ import annotations

from typing import Any

from selbench.contract.api import (
    CoverageLoss,
    Dataset,
    DifferentiableRecalibrator,
    SelectionLoss,
    TrainableSelector,
)
from selbench.contract.params import PluginBase
from selbench.contract.registry import Registered, Registry
from selbench.measure.metrics import METRICS
from selbench.spec.model import (
    METHOD_FIELDS,
    ExperimentSpec,
    MethodSpec,
    ResolvedSpec,
    is_oracle,
    objectives,
)
from selbench.spec.search import method_space

# What plugins declare about each other (see the table in :mod:`selbench.contract.api`), read from
# the factory when it is a class. Nothing here depends on a plugin's name.
_UNDECLARED = object()


def _cap(reg: Registered | None, attr: str, default: Any = _UNDECLARED) -> Any:
    """The capability ``attr`` of a plugin's factory class; ``default`` when the class does
    not have it; :data:`_UNDECLARED` when the factory is not a class (nothing known)."""
    factory = reg.plugin.factory if reg is not None else None
    if not isinstance(factory, type):
        return _UNDECLARED
    return getattr(factory, attr, default)


def _is(reg: Registered | None, base: type) -> Any:
    """Whether a plugin's factory class is a ``base`` (the typed protocols of
    :mod:`selbench.contract.api`); :data:`_UNDECLARED` when the factory is not a class."""
    factory = reg.plugin.factory if reg is not None else None
    if not isinstance(factory, type):
        return _UNDECLARED
    return issubclass(factory, base)


def _names(registry: Registry, kind: str, want: Any, sep: str = ", ") -> str:
    """The registered plugins of ``kind`` whose factory satisfies ``want(factory)``."""
    return sep.join(r.plugin.name for r in registry.all(kind)
                    if isinstance(r.plugin.factory, type) and want(r.plugin.factory))


def _hint(text: str, names: str) -> str:
    return _hints((text, names))


def _hints(*pairs: tuple[str, str]) -> str:
    """`` (a: x, y; b: z)`` for the (text, names) pairs whose names are not empty."""
    parts = [f"{text}: {names}" for text, names in pairs if names]
    return f" ({'; '.join(parts)})" if parts else ""


def check_inputs_kind(registry: Registry, dataset: Registered, backbone: Registered,
                      path: str, errors: list[str]) -> None:
    """The dataset's ``input_kind`` must be one of the backbone's ``input_kinds``."""
    provided = _cap(dataset, "input_kind", None)
    accepted = _cap(backbone, "input_kinds", None)
    if not isinstance(provided, str) or accepted in (None, _UNDECLARED) or provided in accepted:
        return
    others = _names(registry, "backbone",
                    lambda f: provided in (getattr(f, "input_kinds", None) or ()))
    errors.append(
        f"{path}.name: backbone {backbone.plugin.name!r} reads {' or '.join(sorted(accepted))} "
        f"inputs, but dataset {dataset.plugin.name!r} provides {provided}"
        + _hint(f"backbones that read {provided}", others)
    )


def check_method(registry: Registry, m: MethodSpec, regs: dict[str, Registered | None],
                  mbase: str, errors: list[str]) -> None:
    """A method's selector, recalibrator and losses against its scheme's declarations."""
    scheme = regs.get("scheme")
    if scheme is None or not isinstance(scheme.plugin.factory, type):
        return
    _check_required_losses(registry, m, scheme, mbase, errors)
    _check_selector(registry, m, scheme, regs.get("selector"), mbase, errors)
    not_differentiable = _check_recalibrator(registry, m, scheme, regs.get("recalibrator"),
                                             mbase, errors)
    _check_log_probs(registry, m, scheme, regs, not_differentiable, mbase, errors)


def _check_required_losses(registry: Registry, m: MethodSpec, scheme: Registered,
                           mbase: str, errors: list[str]) -> None:
    """The losses the scheme ``requires`` are named by the method."""
    name = scheme.plugin.name
    requires = _cap(scheme, "requires", frozenset())
    if "loss" in requires and m.loss is None:
        choices = _names(registry, "loss", lambda f: issubclass(f, SelectionLoss), "|")
        errors.append(f"{mbase}.loss: scheme {name!r} needs a selective loss "
                      f"(loss: {{name: {choices or '...'}}})")
    if "coverage" in requires and m.coverage is None:
        choices = _names(registry, "loss", lambda f: issubclass(f, CoverageLoss), "|")
        errors.append(f"{mbase}.coverage: scheme {name!r} needs a coverage loss "
                      f"(coverage: {{name: {choices or '...'}}})")


def _check_selector(registry: Registry, m: MethodSpec, scheme: Registered,
                    selector: Registered | None, mbase: str, errors: list[str]) -> None:
    """The selector is trainable exactly when the scheme says it must be."""
    name = scheme.plugin.name
    must_train = _cap(scheme, "selector_must_be_trainable", None)
    trainable = _is(selector, TrainableSelector)
    if must_train is not None and trainable is not _UNDECLARED and bool(trainable) != must_train:
        sel = f"selector {m.selector.name!r}"
        if must_train:
            errors.append(
                f"{mbase}.selector.name: scheme {name!r} trains the selector through its loss; "
                f"{sel} is not trainable"
                + _hint("trainable selectors", _names(
                    registry, "selector", lambda f: issubclass(f, TrainableSelector)))
            )
        else:
            errors.append(
                f"{mbase}.selector.name: scheme {name!r} only fits non-trainable selectors; "
                f"{sel} is trained through a loss"
                + _hint("schemes that train it", _names(
                    registry, "scheme", lambda f: getattr(f, "selector_must_be_trainable", None)
                    is True))
            )


def _check_recalibrator(registry: Registry, m: MethodSpec, scheme: Registered,
                        recal: Registered | None, mbase: str, errors: list[str]) -> bool:
    """The recalibrator is differentiable, and fitted, where the scheme needs it; returns
    whether it is known not to be differentiable (and that is not reported yet)."""
    name = scheme.plugin.name
    rname = f"recalibrator {m.recalibrator.name!r}"
    differentiable = _is(recal, DifferentiableRecalibrator)
    not_differentiable = differentiable is not _UNDECLARED and not differentiable
    if _cap(scheme, "recalibrator_must_be_differentiable", False) and not_differentiable:
        errors.append(
            f"{mbase}.recalibrator.name: scheme {name!r} trains the recalibrator with the "
            f"selector and needs a differentiable one; {rname} is not"
            + _hint("differentiable recalibrators", _names(
                registry, "recalibrator", lambda f: issubclass(f, DifferentiableRecalibrator)))
        )
        not_differentiable = False  # reported once: the log-probabilities follow from it
    if (not _cap(scheme, "fits_recalibrator", True)
            and _cap(recal, "usable_unfitted", None) is False):
        errors.append(
            f"{mbase}.recalibrator.name: scheme {name!r} uses the recalibrator as given, "
            f"without fitting it; {rname} must be fitted first"
            + _hint("recalibrators usable unfitted", _names(
                registry, "recalibrator", lambda f: getattr(f, "usable_unfitted", None) is True))
        )
    return not_differentiable


def check_distribution_metrics(registry: Registry, exp: ExperimentSpec, base: str,
                               errors: list[str]) -> None:
    """A column of the recalibrated distribution (registry ``needs="log_probs"``: the
    full-distribution NLL, the class-wise ECE) needs every method's recalibrator to define
    that distribution: a :class:`DifferentiableRecalibrator` declaring
    ``provides_log_probs = True``. A factory function declares nothing (checked when run)."""
    wanted = [k for k in exp.metrics or () if METRICS[k].needs == "log_probs"]
    if not wanted:
        return
    for m_i, m in enumerate(exp.methods):
        name = m.recalibrator.name if m.recalibrator is not None else "none"
        try:
            reg = registry.get("recalibrator", name)
        except Exception:  # an unknown plugin is reported by the component checks
            continue
        if _cap(reg, "provides_log_probs", None) is _UNDECLARED:
            continue
        if not (_is(reg, DifferentiableRecalibrator) is True
                and _cap(reg, "provides_log_probs", None) is True):
            errors.append(
                f"{base}.metrics: {', '.join(map(repr, wanted))} need the recalibrated "
                f"distribution, which recalibrator {name!r} of {base}.methods[{m_i}] "
                f"({m.label}) does not define (it declares no provides_log_probs)"
                + _hint("recalibrators that define it", _names(
                    registry, "recalibrator", lambda f: issubclass(f, DifferentiableRecalibrator)
                    and getattr(f, "provides_log_probs", None) is True)))


def _defines_distribution(reg: Registered) -> Any:
    """Whether a recalibrator defines the recalibrated distribution (a
    :class:`DifferentiableRecalibrator` declaring ``provides_log_probs = True``);
    :data:`_UNDECLARED` for a factory function (checked when run)."""
    if _cap(reg, "provides_log_probs", None) is _UNDECLARED:
        return _UNDECLARED
    return (_is(reg, DifferentiableRecalibrator) is True
            and _cap(reg, "provides_log_probs", None) is True)


def check_tuning_objective(registry: Registry, exp: ExperimentSpec, base: str,
                           errors: list[str]) -> None:
    """What the tuning block needs from each method it tunes (a method with a search space):
    an objective of the recalibrated distribution (registry ``needs="log_probs"``) a
    recalibrator that defines it, as the columns of :func:`check_distribution_metrics`; an
    oracle something to tune. The messages list only the objectives that can work."""
    if exp.tuning is None:
        return
    needs = METRICS[exp.tuning.objective].needs
    for m_i, m in enumerate(exp.methods):
        try:
            space = method_space(registry, m)
            reg = registry.get("recalibrator", m.recalibrator.name)
        except Exception:  # an unknown plugin or a bad space is reported by their checks
            continue
        if not space:
            if is_oracle(exp, m):
                errors.append(f"{base}.methods[{m_i}].tuning.oracle: {m.label!r} has no search "
                              "space, so nothing is tuned on the evaluation labels; leave it "
                              "out of the oracle")
            continue
        if needs == "log_probs" and _defines_distribution(reg) is False:
            errors.append(
                f"{base}.tuning.objective: {exp.tuning.objective!r} needs the recalibrated "
                f"distribution, which recalibrator {m.recalibrator.name!r} of "
                f"{base}.methods[{m_i}] ({m.label}) does not define; objectives that can tune "
                f"it: {', '.join(objectives((None,)))}"
                + _hint("recalibrators that define it", _names(
                    registry, "recalibrator", lambda f: issubclass(f, DifferentiableRecalibrator)
                    and getattr(f, "provides_log_probs", None) is True)))


def _check_log_probs(registry: Registry, m: MethodSpec, scheme: Registered,
                     regs: dict[str, Registered | None], not_differentiable: bool,
                     mbase: str, errors: list[str]) -> None:
    """A loss that needs log-probabilities gets them from a recalibrator that provides them,
    where the scheme reads them off the recalibrator."""
    recal, loss = regs.get("recalibrator"), regs.get("loss")
    rname = f"recalibrator {m.recalibrator.name!r}"
    if (_cap(scheme, "loss_reads_recalibrator_log_probs", False)
            and _cap(loss, "needs_log_probs", False) is True
            and (not_differentiable or _cap(recal, "provides_log_probs", None) is False)):
        errors.append(
            f"{mbase}.loss.name: loss {m.loss.name!r} needs the recalibrator's "
            f"log-probabilities, which {rname} does not provide"
            + _hints(
                ("losses that do not need them", _names(
                    registry, "loss", lambda f: issubclass(f, SelectionLoss)
                    and not getattr(f, "needs_log_probs", False))),
                ("recalibrators that provide them", _names(
                    registry, "recalibrator", lambda f: issubclass(f, DifferentiableRecalibrator)
                    and getattr(f, "provides_log_probs", None) is True)),
            )
        )


def _overrides(factory: Any, base: type, method: str) -> bool:
    """Whether a plugin's factory class overrides ``base.method`` (declares the hook)."""
    return isinstance(factory, type) and getattr(factory, method, None) is not getattr(
        base, method)


def check_data(resolved: ResolvedSpec, exp: ExperimentSpec, base: str) -> list[str]:
    """``path: problem`` for what a run of ``exp`` would reject in its data, found without
    running a backbone: the declared inputs of every plugin overriding ``check_inputs``
    (opened by it), and, when the dataset declares ``split_sizes``, the split names and
    ``n_fit`` against them. Only plugins declaring a hook are built (their ``__init__`` only
    stores parameters)."""
    comps = [("dataset", "dataset", exp.dataset), ("backbone", "backbone", exp.backbone)]
    for m_i, m in enumerate(exp.methods):
        comps += [(kind, f"methods[{m_i}].{field}", getattr(m, field))
                  for kind, field in METHOD_FIELDS if getattr(m, field) is not None]
    problems: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    for kind, where, comp in comps:
        factory = resolved.registry.get(kind, comp.name).plugin.factory
        inputs = resolved.inputs(kind, comp)
        hook = bool(inputs) and _overrides(factory, PluginBase, "check_inputs")
        sizes = kind == "dataset" and _overrides(factory, Dataset, "split_sizes")
        ident = (kind, comp.name, repr(sorted(resolved.params(kind, comp).items())))
        if not (hook or sizes) or (ident in seen and not sizes):
            continue
        seen.add(ident)
        path = f"{base}.{where}" + (f".params.{next(iter(inputs))}" if len(inputs) == 1 else "")
        try:
            plugin = resolved.build(kind, comp)
            if hook:
                plugin.check_inputs()
            known = plugin.split_sizes() if sizes else None
        except (ValueError, OSError) as exc:
            problems.append(f"{path}: {exc}")
            continue
        if known is not None:
            problems += _check_split_sizes(exp, known, base)
    return problems


def _check_split_sizes(exp: ExperimentSpec, sizes: dict[str, int], base: str) -> list[str]:
    """The experiment's split names exist in ``sizes``, and its ``n_fit`` fits its split."""
    name = exp.dataset.name
    problems = [
        f"{base}.{which}: dataset {name!r} has no split {split!r}; available: "
        f"{', '.join(sizes)}"
        for which, split in (("fit_split", exp.fit_split), ("eval_split", exp.eval_split))
        if split not in sizes
    ]
    n = sizes.get(exp.fit_split)
    if exp.n_fit is not None and n is not None and exp.n_fit > n:
        problems.append(f"{base}.n_fit: {exp.n_fit} examples asked, but split "
                        f"{exp.fit_split!r} of dataset {name!r} has only {n}; lower n_fit to "
                        f"at most {n}, or leave it out to fit on the whole split")
    return problems
