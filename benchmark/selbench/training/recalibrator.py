"""The public base of a differentiable recalibrator that keeps its live torch module in
``module_`` (:class:`ModuleRecalibrator`, exported as ``selbench.ModuleRecalibrator``): what
such a recalibrator needs besides its own ``fit``, so that a plugin author writes only the
module and the fit (CONTRIBUTING's jointly trainable example is one).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from selbench.contract.api import DifferentiableRecalibrator, FitContext
from selbench.contract.checks import NotFittedError, check_outputs
from selbench.contract.data import ModelOutputs
from selbench.training.torchutils import run_module

__all__ = ["ModuleRecalibrator"]


class ModuleRecalibrator(DifferentiableRecalibrator):
    """A :class:`~selbench.DifferentiableRecalibrator` whose :meth:`fit` stores its live
    torch module in ``module_`` (a :class:`~selbench.contract.api.RecalibratorModule`:
    ``forward(logits, features) -> (confidence [B], log_probs [B, K] or None)``).

    A subclass implements ``fit(outputs, context)``, which builds ``self.module_`` and
    returns ``self``; this base gives the rest of the protocol:

    * :meth:`confidence`: the module's first output on the outputs (eval mode, no
      gradients, chunked, on the module's device: :func:`selbench.run_module`), clipped to
      [0, 1] — so what a joint scheme trains in ``module_`` is what the evaluation sees;
    * :meth:`module`: ``module_`` itself, the live module a scheme trains in place;
    * the errors the conformance kit asks for: a ``TypeError`` for inputs that are not
      :class:`~selbench.ModelOutputs` and a :class:`~selbench.NotFittedError` before
      :meth:`fit`, each naming the plugin by :attr:`name`.

    Declare ``provides_log_probs = True`` when the module's second output is the full
    log-probability vector (then S-MCE can train it, ``predict_proba`` and the
    distribution's metrics use it); the default says nothing (``None``). A module whose
    prediction can differ from ``argmax(logits)`` also overrides :meth:`predict`.
    """

    usable_unfitted: ClassVar[bool | None] = False
    #: how messages name the plugin (default: the class name); set it to the registered name
    name: ClassVar[str | None] = None

    #: the live module, set by :meth:`fit`
    module_: Any

    def who(self) -> str:
        """``recalibrator '<name>'``, as messages name this plugin."""
        return f"recalibrator {self.name or type(self).__name__!r}"

    def check_fitted(self) -> None:
        """A :class:`~selbench.NotFittedError` naming the plugin before :meth:`fit`."""
        if getattr(self, "module_", None) is None:
            raise NotFittedError(f"{self.who()} is not fitted; call fit first")

    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        """The module's recalibrated top-label confidence, float64 ``[N]`` in [0, 1]."""
        check_outputs(outputs, self.who())
        self.check_fitted()
        return np.clip(run_module(self.module_, outputs.logits, outputs.features), 0.0, 1.0)

    def module(self, outputs: ModelOutputs, context: FitContext) -> Any:
        """The live module ``module_`` (not a copy): a scheme trains it in place."""
        self.check_fitted()
        return self.module_
