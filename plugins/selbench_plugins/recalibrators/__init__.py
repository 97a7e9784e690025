"""Built-in recalibrators (h): ``none``, ``temperature``, ``platt``, ``histogram-binning``,
``platt-binning``, ``mlp``.

A recalibrator maps a model's outputs to a recalibrated *top-label* confidence; the
prediction itself is always ``argmax(logits)`` and is never changed.

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
  gradients), so training done by a scheme is what the evaluation sees.

The built-ins define ``log_probs`` as: ``none`` log_softmax(z); ``temperature``
log_softmax(z/T); ``platt`` binary: [log(1-p1'), log p1'], top-label: log c on the
predicted class and log(1-c) + log(p_k / (1 - p_top)) on the others (the remaining mass
shared in proportion to the original probabilities); ``mlp``: none (None).

Non-differentiable recalibrators (the binning methods) only implement ``fit`` and
``confidence``; schemes that train g after them use their confidence as a fixed input.
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
