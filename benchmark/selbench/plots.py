"""selbench's figures, the public face: reliability diagrams, metric-vs-coverage curves and
risk-coverage curves. They are drawn by :mod:`selbench.reporting.plots`; this module is the
path users import.
"""

from selbench.reporting.plots import *  # noqa: F403
from selbench.reporting.plots import __all__  # noqa: F401
