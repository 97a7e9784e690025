"""Built-in losses: selection losses ``s-tlbce``, ``s-mce``, ``s-mmce`` (named by a
method's ``loss``) and coverage losses ``quadratic``, ``log-coverage`` (named by its
``coverage``). All are torch callables, differentiable in ĝ and in the recalibrated
confidence; the training scheme minimises ``loss(ĝ, ĥ, y^c, ...) + coverage(ĝ, β)``.
"""

from selbench.api import Plugin

from .coverage import LogCoverage, LogCoverageParams, QuadraticCoverage, QuadraticCoverageParams
from .selection import SMCE, SMMCE, STLBCE, SelectionLossParams, SMMCEParams

PLUGINS: list[Plugin] = [
    Plugin("s-tlbce", STLBCE, SelectionLossParams),
    Plugin("s-mce", SMCE, SelectionLossParams),
    Plugin("s-mmce", SMMCE, SMMCEParams),
    Plugin("quadratic", QuadraticCoverage, QuadraticCoverageParams),
    Plugin("log-coverage", LogCoverage, LogCoverageParams),
]
