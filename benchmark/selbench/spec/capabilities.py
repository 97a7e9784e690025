"""The capability checks of a spec: what the plugins of a method or an experiment declare
about each other (see the table in :mod:`selbench.contract.api`), read from each factory
class: a scheme's required losses and selector/recalibrator kinds (:func:`check_method`) and
the dataset inputs a backbone reads (:func:`check_inputs_kind`). Nothing here depends on a
plugin's name.
"""

from __future__ import annotations

from typing import Any

from selbench.contract.api import (
    CoverageLoss,
    DifferentiableRecalibrator,
    SelectionLoss,
    TrainableSelector,
)
from selbench.contract.registry import Registered, Registry
from selbench.spec.model import MethodSpec

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
