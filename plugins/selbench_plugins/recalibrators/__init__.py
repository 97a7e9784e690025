"""Built-in recalibrators (h): ``none``, ``temperature``, ``platt``, ``histogram-binning``,
``platt-binning``, ``mlp``.

A recalibrator maps a model's outputs to a recalibrated *top-label* confidence of its
prediction ``predict(outputs)``. That prediction is ``argmax(logits)`` for all built-ins but
the binary modes of ``platt`` and ``platt-binning``, which are scored as Kumar et al.'s
``calibration`` package scores a binary output ``q = P(class 1)`` in top-label mode: the
prediction is the argmax of ``[1-q, q]`` (class 0 on the tie q = 0.5) and the confidence
``max(q, 1-q)``, so recalibration may change the predicted class.

Protocol for differentiable recalibrators (what a third-party author implements so that
the ``joint`` scheme can train h together with a selector, and the ``sequential`` /
``selection`` schemes can read the full log-probability vector):

* set the class attribute ``differentiable = True``;
* after ``fit(outputs, context)``, ``module(outputs, context)`` returns the recalibrator's
  *own live* ``torch.nn.Module`` holding its learned state — not a copy. A scheme may move
  it to ``context.device`` (``module.to(device)`` acts in place), train its parameters in
  place, and moves it back to the CPU afterwards; the recalibrator then reflects the
  training;
* ``module.forward(logits [B, K], features [B, d])`` returns ``(confidence [B],
  log_probs [B, K] or None)``: ``confidence`` in [0, 1] is the recalibrated top-label
  confidence, differentiable in the module's parameters; ``log_probs`` is the full
  recalibrated log-probability vector where one is defined (needed by the S-MCE loss),
  else ``None``. Inputs arrive as float32 tensors on the module's device;
* ``confidence(outputs)`` computes its result with that same module (eval mode, no
  gradients), so training done by a scheme is what the evaluation sees;
* a module whose prediction can differ from ``argmax(logits)`` has ``changes_prediction``
  true and ``predict(logits, features) -> int64 [B]`` (what the recalibrator's ``predict``
  returns); ``confidence`` is then the probability of that prediction, and the schemes
  give the selective loss the correctness of that prediction, recomputed at every step
  while h trains (batched: the stacked module's ``correct(batch)``).

The built-ins define ``log_probs`` as: ``none`` log_softmax(z); ``temperature``
log_softmax(z/T); ``platt`` binary: [log(1-p1'), log p1'] (the confidence is
max(p1', 1-p1'), of the predicted class argmax), top-label: log c on the
predicted class and log(1-c) + log(p_k / (1 - p_top)) on the others (the remaining mass
shared in proportion to the original probabilities); ``mlp``: none (None).

Non-differentiable recalibrators (the binning methods) only implement ``fit`` and
``confidence`` (and ``predict`` where it can change); schemes that train g after them use
their confidence, and the correctness of their prediction, as fixed inputs.
"""

from selbench.api import NoParams, Plugin

from .binning import HistogramBinning, HistogramBinningParams, PlattBinning, PlattBinningParams
from .identity import IdentityRecalibrator
from .mlp import MLPRecalibrator, MLPRecalibratorParams
from .platt import PlattParams, PlattScaling
from .temperature import TemperatureParams, TemperatureScaling

PLUGINS: list[Plugin] = [
    Plugin("none", IdentityRecalibrator, NoParams),
    Plugin("temperature", TemperatureScaling, TemperatureParams),
    Plugin("platt", PlattScaling, PlattParams),
    Plugin("histogram-binning", HistogramBinning, HistogramBinningParams),
    Plugin("platt-binning", PlattBinning, PlattBinningParams),
    Plugin("mlp", MLPRecalibrator, MLPRecalibratorParams),
]
