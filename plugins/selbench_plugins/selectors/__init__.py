"""Built-in selectors (g): ``mlp`` (the learned soft selector), ``confidence``,
``isolation-forest``, ``one-class-svm``, ``none``, and ``oracle``.

A selector scores examples, higher = accepted first; the core turns scores into accept /
reject decisions at each coverage level. Non-trainable selectors are fitted by their own
``fit(outputs, confidence, context)`` (the ``recalibration`` scheme calls it with the
recalibrated confidence, so the baselines are applied to the recalibrated model). A
:class:`selbench.api.TrainableSelector` (``mlp``) is trained by the ``selection``,
``sequential`` or ``joint`` scheme through ``inputs`` / ``init_module``.
"""

from selbench.api import Plugin

from .baselines import (
    ConfidenceSelector,
    IsolationForestSelector,
    NoSelector,
    OneClassSVMSelector,
)
from .mlp import MLPSelector
from .oracle import PLUGIN as _ORACLE_DOMAIN

PLUGINS: list[Plugin] = [
    Plugin("mlp", MLPSelector),
    Plugin("confidence", ConfidenceSelector),
    Plugin("isolation-forest", IsolationForestSelector),
    Plugin("one-class-svm", OneClassSVMSelector),
    Plugin("none", NoSelector),
    _ORACLE_DOMAIN,
]
