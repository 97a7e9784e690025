"""Built-in schemes: how h and g are fitted.

* ``recalibration`` — fit h only (then fit a non-trainable selector on its output);
* ``selection`` — train the learned selector g with h as given (normally ``none``);
* ``sequential`` — fit h, freeze it, train g;
* ``joint`` — fit h, then train g and h together (selective recalibration).

The three training schemes share :class:`~selbench_plugins.schemes.training.TrainingParams`
(Appendix A of the paper); see :mod:`selbench_plugins.schemes.training` for the loop.
"""

from selbench.api import Plugin

from .recalibration import RecalibrationParams, RecalibrationScheme
from .training import JointScheme, SelectionScheme, SequentialScheme, TrainingParams

PLUGINS: list[Plugin] = [
    Plugin("recalibration", RecalibrationScheme, RecalibrationParams),
    Plugin("selection", SelectionScheme, TrainingParams),
    Plugin("sequential", SequentialScheme, TrainingParams),
    Plugin("joint", JointScheme, TrainingParams),
]
