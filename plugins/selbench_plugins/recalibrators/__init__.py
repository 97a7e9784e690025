"""Built-in recalibrators (h): ``none``, ``temperature``, ``platt``, ``histogram-binning``,
``platt-binning``, ``mlp``, ``isotonic``, ``beta``, ``ensemble-temperature``,
``vector-scaling``, ``matrix-scaling``, ``dirichlet``, ``sms``, ``svs``, ``venn-abers``.

A recalibrator maps a model's outputs to a recalibrated *top-label* confidence of its
prediction ``predict(outputs)``. That prediction is ``argmax(logits)`` for all built-ins but
the binary modes of ``platt``, ``platt-binning`` and ``beta``, which are scored as Kumar et al.'s
``calibration`` package scores a binary output ``q = P(class 1)`` in top-label mode: the
prediction is the argmax of ``[1-q, q]`` (class 0 on the tie q = 0.5) and the confidence
``max(q, 1-q)``, so recalibration may change the predicted class; and ``vector-scaling``,
``matrix-scaling``, ``dirichlet``, ``sms``, ``svs``, whose prediction is the argmax of their
calibrated probabilities (the confidence is its probability).

Differentiable recalibrators (``none``, ``temperature``, ``platt``, ``mlp``, ``beta``,
``ensemble-temperature``, ``vector-scaling``, ``matrix-scaling``, ``dirichlet``, ``sms``,
``svs``) subclass
:class:`selbench.contract.api.DifferentiableRecalibrator`, whose docstring is the protocol a
third-party author implements so that the ``joint`` scheme can train h together with a
selector and the ``sequential`` / ``selection`` schemes can read the full log-probability
vector; binary Platt's module is a :class:`selbench.contract.api.PredictingModule`, as are the
modules of the three affine maps (batched by ``torch.func``). The other module
classes implement the batched-training protocol (``stacked``, see
:class:`selbench.contract.api.StackableModule`).

The built-ins define ``log_probs`` as: ``none`` log_softmax(z); ``temperature``
log_softmax(z/T); ``platt`` binary: [log(1-p1'), log p1'] (the confidence is
max(p1', 1-p1'), of the predicted class argmax), top-label: log c on the
predicted class and log(1-c) + log(p_k / (1 - p_top)) on the others (the remaining mass
shared in proportion to the original probabilities); ``beta``: as ``platt``, with the
beta-calibrated probability; ``ensemble-temperature``: log(w0 softmax(z/T) + w1 softmax(z)
+ w2/K); ``vector-scaling`` log_softmax(w z + b); ``matrix-scaling`` log_softmax(W z + b);
``dirichlet`` log_softmax(W log_softmax(z) + b); ``sms`` log_softmax(W x + b) and ``svs``
log_softmax(w * x + b) with x the tempered log-probabilities mixed with the uniform
distribution (:mod:`.structured`); ``mlp``: none (None).

Non-differentiable recalibrators (the binning methods, ``isotonic``, ``venn-abers``) only
implement ``fit`` and ``confidence`` (and ``predict`` where it can change); schemes that train g after them use
their confidence, and the correctness of their prediction, as fixed inputs.
"""

from selbench.contract.api import Plugin

from .beta import BetaCalibration
from .binning import HistogramBinning, PlattBinning
from .ensemble import EnsembleTemperatureScaling
from .identity import IdentityRecalibrator
from .isotonic import IsotonicCalibration
from .matrix import DirichletCalibration, MatrixScaling, VectorScaling
from .mlp import MLPRecalibrator
from .platt import PlattScaling
from .structured import StructuredMatrixScaling, StructuredVectorScaling
from .temperature import TemperatureScaling
from .vennabers import VennAbersPredictor

PLUGINS: list[Plugin] = [
    Plugin("none", IdentityRecalibrator),
    Plugin("temperature", TemperatureScaling),
    Plugin("platt", PlattScaling),
    Plugin("histogram-binning", HistogramBinning),
    Plugin("platt-binning", PlattBinning),
    Plugin("mlp", MLPRecalibrator),
    Plugin("isotonic", IsotonicCalibration),
    Plugin("beta", BetaCalibration),
    Plugin("ensemble-temperature", EnsembleTemperatureScaling),
    Plugin("vector-scaling", VectorScaling),
    Plugin("matrix-scaling", MatrixScaling),
    Plugin("dirichlet", DirichletCalibration),
    Plugin("sms", StructuredMatrixScaling),
    Plugin("svs", StructuredVectorScaling),
    Plugin("venn-abers", VennAbersPredictor),
]
