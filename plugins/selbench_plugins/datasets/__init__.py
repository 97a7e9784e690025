"""Built-in datasets plugins."""

from .calarena import PLUGIN as _CALARENA
from .cifar import PLUGINS as _CIFAR
from .digits import PLUGIN as _DIGITS
from .fdshifts import PLUGIN as _FDSHIFTS
from .imagenet import PLUGIN as _IMAGENET
from .precomputed import PLUGIN as _PRECOMPUTED
from .sentences import PLUGIN as _SENTENCES
from .theory import PLUGIN as _THEORY_MIXTURE
from .wilds_data import PLUGINS as _WILDS

PLUGINS: list = [_DIGITS, _THEORY_MIXTURE]
PLUGINS += [*_WILDS, _IMAGENET, *_CIFAR, _PRECOMPUTED, _CALARENA, _FDSHIFTS, _SENTENCES]
