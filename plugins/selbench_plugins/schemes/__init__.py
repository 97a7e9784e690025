"""Built-in schemes: how h and g are fitted.

* ``recalibration`` — fit h only (then fit a non-trainable selector on its output);
* ``selection`` — train the learned selector g with h as given (normally ``none``);
* ``sequential`` — fit h, freeze it, train g;
* ``joint`` — fit h, then train g and h together (selective recalibration).

The three training schemes share their hyperparameters (Appendix A of the paper); see
:mod:`selbench_plugins.schemes.training`, which trains all replicas of a method with the
training engine (:mod:`selbench.training.engine`).
"""

from selbench.contract.api import Plugin

from .recalibration import RecalibrationScheme
from .training import JointScheme, SelectionScheme, SequentialScheme

PLUGINS: list[Plugin] = [
    Plugin("recalibration", RecalibrationScheme),
    Plugin("selection", SelectionScheme),
    Plugin("sequential", SequentialScheme),
    Plugin("joint", JointScheme),
]
