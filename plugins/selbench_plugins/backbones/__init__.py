"""Built-in backbones plugins."""

from .clip import PLUGIN as _CLIP
from .digits_net import PLUGIN as _DIGITS_NET
from .linear import PLUGIN as _THEORY_LINEAR
from .precomputed import PLUGIN as _PRECOMPUTED
from .sentence_encoder import PLUGIN as _SENTENCE_ENCODER
from .torchvision_nets import PLUGIN as _RESNET34
from .wilds_nets import PLUGINS as _WILDS_NETS

PLUGINS: list = [_DIGITS_NET, _THEORY_LINEAR]
PLUGINS += [_RESNET34, *_WILDS_NETS, _CLIP, _PRECOMPUTED, _SENTENCE_ENCODER]
