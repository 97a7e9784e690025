"""Built-in backbones plugins."""

from .digits_net import PLUGIN as _DIGITS_NET
from .linear import PLUGIN as _THEORY_LINEAR

PLUGINS: list = [_DIGITS_NET, _THEORY_LINEAR]
