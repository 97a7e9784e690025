"""``precomputed``: the pass-through backbone of the ``precomputed`` dataset.

The ``precomputed`` dataset (:mod:`selbench_plugins.datasets.precomputed`) reads your own
model's outputs from an ``.npz``; its splits hold ready-made
:class:`~selbench.contract.data.ModelOutputs` (the ``model-outputs`` input kind), which this backbone
returns unchanged.
"""

from __future__ import annotations

from selbench.contract.api import Backbone, Dataset, FitContext, Plugin
from selbench.contract.data import DataError, ModelOutputs

__all__ = ["PLUGIN", "PairingError", "PrecomputedBackbone"]


class PairingError(DataError, TypeError):
    """A backbone was paired with a dataset whose inputs it cannot take (a
    :class:`DataError`, so the runner reports it for its experiment; also a ``TypeError``)."""


class PrecomputedBackbone(Backbone):
    """Pass-through: returns the dataset's ready-made outputs (use with ``precomputed``)."""

    input_kinds = frozenset({"model-outputs"})

    def extract(self, dataset: Dataset, split: str, context: FitContext) -> ModelOutputs:
        data = dataset.split(split)
        if not isinstance(data.inputs, ModelOutputs):
            raise PairingError(
                f"precomputed backbone: split {split!r} of {type(dataset).__name__} holds "
                f"{type(data.inputs).__name__}, not model outputs; pair it with the "
                "'precomputed' dataset (or use an image backbone)"
            )
        return data.inputs


PLUGIN = Plugin(
    "precomputed",
    PrecomputedBackbone,
    summary="pass-through for the 'precomputed' dataset: returns its outputs unchanged",
)
