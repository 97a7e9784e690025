"""selbench's built-in plugins, laid out as any third-party plugin package would be.

Each sub-package lists its plugins in ``PLUGINS``; the hook implementations below hand them
to selbench. A third-party package does the same and registers this module (or its own)
in the ``selbench`` entry-point group.
"""

from selbench import hookimpl

__version__ = "0.1.0"


@hookimpl
def selbench_datasets():
    from selbench_plugins.datasets import PLUGINS

    return PLUGINS


@hookimpl
def selbench_backbones():
    from selbench_plugins.backbones import PLUGINS

    return PLUGINS


@hookimpl
def selbench_selectors():
    from selbench_plugins.selectors import PLUGINS

    return PLUGINS


@hookimpl
def selbench_recalibrators():
    from selbench_plugins.recalibrators import PLUGINS

    return PLUGINS


@hookimpl
def selbench_losses():
    from selbench_plugins.losses import PLUGINS

    return PLUGINS


@hookimpl
def selbench_schemes():
    from selbench_plugins.schemes import PLUGINS

    return PLUGINS
