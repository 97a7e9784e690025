"""Built-in selectors (g): ``mlp`` (the learned soft selector), ``confidence``,
``isolation-forest``, ``one-class-svm``, ``none``, and ``oracle``.

A selector scores examples, higher = accepted first; the core turns scores into accept /
reject decisions at each coverage level. Non-trainable selectors are fitted by their own
``fit(outputs, confidence, context)`` (the ``recalibration`` scheme calls it with the
recalibrated confidence, so the baselines are applied to the recalibrated model). A
:class:`selbench.contract.api.TrainableSelector` (``mlp``) is trained by the ``selection``,
``sequential`` or ``joint`` scheme through ``inputs`` / ``init_module``. ``meta-features``
is Fisch et al.'s (TMLR 2022) calibrated selective classification selector: a trainable
selector on standardised meta-features (confidence and OOD detector scores).

Scores of the backbone's logits (``entropy``, ``margin``, ``max-logit``,
``maxlogit-pnorm``: :mod:`.scores`) and of the feature embedding (``knn-distance``,
``mahalanobis``, ``lof``, ``kde``: :mod:`.density`) are non-trainable selectors fitted on
the fitting data only.
"""

from selbench.contract.api import Plugin

from .baselines import (
    ConfidenceSelector,
    IsolationForestSelector,
    NoSelector,
    OneClassSVMSelector,
)
from .density import KDESelector, KNNDistanceSelector, LOFSelector, MahalanobisSelector
from .metafeatures import MetaFeatureSelector
from .mlp import MLPSelector
from .oracle import PLUGIN as _ORACLE_DOMAIN
from .scores import EntropySelector, MarginSelector, MaxLogitPNormSelector, MaxLogitSelector

PLUGINS: list[Plugin] = [
    Plugin("mlp", MLPSelector),
    Plugin("meta-features", MetaFeatureSelector),
    Plugin("confidence", ConfidenceSelector),
    Plugin("isolation-forest", IsolationForestSelector),
    Plugin("one-class-svm", OneClassSVMSelector),
    Plugin("entropy", EntropySelector),
    Plugin("margin", MarginSelector),
    Plugin("max-logit", MaxLogitSelector),
    Plugin("maxlogit-pnorm", MaxLogitPNormSelector),
    Plugin("knn-distance", KNNDistanceSelector),
    Plugin("mahalanobis", MahalanobisSelector),
    Plugin("lof", LOFSelector),
    Plugin("kde", KDESelector),
    Plugin("none", NoSelector),
    _ORACLE_DOMAIN,
]
