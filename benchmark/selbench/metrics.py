"""selbench's metrics, the public face: every metric function and the registry
(:data:`METRICS`) that leaderboard columns are chosen from. The definitions live in
:mod:`selbench.measure`; this module is the path users import (``selbench.metrics.ece``).
"""

from selbench.measure.metrics import *  # noqa: F403
from selbench.measure.metrics import __all__  # noqa: F401
