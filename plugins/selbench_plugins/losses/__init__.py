"""Built-in losses: selection losses ``s-tlbce``, ``s-mce``, ``s-mmce`` (named by a
method's ``loss``) and coverage losses ``quadratic``, ``log-coverage`` (named by its
``coverage``). All are torch callables, differentiable in ĝ and in the recalibrated
confidence; the training scheme minimises ``loss(ĝ, ĥ, y^c, ...) + coverage(ĝ, β)``. Each
is written once for any leading (replica) dimensions (see :class:`selbench.contract.api.SelectionLoss`).
"""

from selbench.contract.api import Plugin

from .coverage import LogCoverage, QuadraticCoverage
from .selection import SMCE, SMMCE, STLBCE

PLUGINS: list[Plugin] = [
    Plugin("s-tlbce", STLBCE),
    Plugin("s-mce", SMCE),
    Plugin("s-mmce", SMMCE),
    Plugin("quadratic", QuadraticCoverage),
    Plugin("log-coverage", LogCoverage),
]
