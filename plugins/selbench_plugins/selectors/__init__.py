"""Built-in selectors (g): ``mlp`` (the learned soft selector), ``confidence``,
``isolation-forest``, ``one-class-svm``, ``none``, and ``oracle``.

A selector scores examples, higher = accepted first; the core turns scores into accept /
reject decisions at each coverage level. Non-trainable selectors are fitted by their own
``fit(outputs, confidence, context)`` (the ``recalibration`` scheme calls it with the
recalibrated confidence, so the baselines are applied to the recalibrated model). A
trainable selector (``trainable = True``) is trained by the ``selection``, ``sequential``
or ``joint`` scheme through ``inputs`` / ``init_module``; see :class:`MLPSelector` for
that protocol.
"""

from selbench.api import NoParams, Plugin

from .baselines import (
    ConfidenceSelector,
    IsolationForestParams,
    IsolationForestSelector,
    NoSelector,
    OneClassSVMParams,
    OneClassSVMSelector,
)
from .mlp import MLPSelector, MLPSelectorParams

PLUGINS: list[Plugin] = [
    Plugin("mlp", MLPSelector, MLPSelectorParams),
    Plugin("confidence", ConfidenceSelector, NoParams),
    Plugin("isolation-forest", IsolationForestSelector, IsolationForestParams),
    Plugin("one-class-svm", OneClassSVMSelector, OneClassSVMParams),
    Plugin("none", NoSelector, NoParams),
]
# the oracle selector (selectors/oracle.py) is appended on the line below
from .oracle import PLUGIN as _ORACLE_DOMAIN  # noqa: E402

PLUGINS.append(_ORACLE_DOMAIN)
