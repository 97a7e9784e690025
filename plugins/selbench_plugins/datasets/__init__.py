"""Built-in datasets plugins."""

from .digits import PLUGIN as _DIGITS
from .theory import PLUGIN as _THEORY_MIXTURE

PLUGINS: list = [_DIGITS, _THEORY_MIXTURE]
