"""``theory-linear``: the pretrained classifier of the paper's theory (Section 5.1.2).

``θ̂ = (1/m) Σ x_i y_i`` over the dataset's pretraining split (``y = ±1``), then the score of
eq. (score): ``f_1(x) = sigmoid(2θ̂ᵀx)``, written as the logits ``[−θ̂ᵀx, +θ̂ᵀx]`` so that the
softmax gives back exactly ``f_{−1}, f_1``. The features are ``x`` itself.
"""

from __future__ import annotations

import hashlib
from typing import Annotated

import numpy as np
from pydantic import Field
from selbench.contract.api import Backbone, Dataset, FitContext, Plugin
from selbench.contract.data import ModelOutputs

__all__ = ["PLUGIN", "TheoryLinear"]


def _binary_inputs(dataset: Dataset, split: str) -> tuple[np.ndarray, np.ndarray, object]:
    data = dataset.split(split)
    x = data.inputs
    if not isinstance(x, np.ndarray) or x.ndim != 2:
        raise ValueError(
            f"theory-linear: split {split!r} inputs: expected a 2-D numpy array [N, p], got "
            f"{type(x).__name__}{'' if not hasattr(x, 'shape') else ' of shape ' + str(x.shape)}"
        )
    labels = np.asarray(data.labels)
    if labels.shape != (x.shape[0],):
        raise ValueError(
            f"theory-linear: split {split!r} labels: expected shape ({x.shape[0]},), "
            f"got {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 1):
        raise ValueError(
            f"theory-linear: split {split!r} labels: expected binary classes {{0, 1}}, "
            f"found values in [{labels.min()}, {labels.max()}]"
        )
    return x.astype(np.float64), labels.astype(np.int64), data


def _check_binary(dataset: Dataset) -> None:
    if getattr(dataset, "num_classes", 2) != 2:
        raise ValueError(
            f"theory-linear: needs a binary dataset, got num_classes={dataset.num_classes}"
        )


def _fingerprint(x: np.ndarray, labels: np.ndarray) -> str:
    return hashlib.sha256(x.tobytes() + labels.tobytes() + str(x.shape).encode()).hexdigest()


class TheoryLinear(Backbone):
    """Linear classifier θ̂ = mean(x·y) of the paper's theory; logits [−θ̂ᵀx, θ̂ᵀx], features x.

    Requires a binary dataset whose inputs are 2-D arrays (``theory-mixture``). Learned
    state: ``theta_hat_`` (set by the first :meth:`extract`).
    """

    input_kinds = frozenset({"vectors"})
    #: row i's outputs are x_i and ±θ̂ᵀx_i (θ̂ from the train split): any row range of a split
    #: is extracted exactly as in the whole split
    shardable = True

    def __init__(
        self,
        train_split: Annotated[str, Field(
            description="split θ̂ = mean(x·y) is estimated on (the pretraining data)",
        )] = "train",
    ):
        self.train_split = train_split

    def fit(self, dataset: Dataset) -> TheoryLinear:
        """Estimate ``θ̂`` on ``dataset``'s ``train_split`` and return ``self``."""
        _check_binary(dataset)
        x, labels, _ = _binary_inputs(dataset, self.train_split)
        if x.shape[0] == 0:
            raise ValueError(f"theory-linear: split {self.train_split!r} is empty")
        y = 2.0 * labels - 1.0
        self.theta_hat_ = (x * y[:, None]).mean(axis=0)
        self._fitted_on = _fingerprint(x, labels)
        return self

    def extract(self, dataset: Dataset, split: str, context: FitContext) -> ModelOutputs:
        _check_binary(dataset)
        x_tr, y_tr, _ = _binary_inputs(dataset, self.train_split)
        if getattr(self, "_fitted_on", None) != _fingerprint(x_tr, y_tr):
            self.fit(dataset)
        x, labels, data = _binary_inputs(dataset, split)
        if x.shape[1] != self.theta_hat_.shape[0]:
            raise ValueError(
                f"theory-linear: split {split!r} inputs have {x.shape[1]} columns but θ̂ was "
                f"estimated in dimension {self.theta_hat_.shape[0]}"
            )
        domain = data.domain
        if context.rows is not None:  # one row range of a distributed extraction
            start, stop = (int(r) for r in context.rows)
            if not 0 <= start < stop <= x.shape[0]:
                raise ValueError(f"theory-linear: rows [{start}, {stop}) are not inside split "
                                 f"{split!r} of {x.shape[0]} examples")
            x, labels = x[start:stop], labels[start:stop]
            domain = None if domain is None else np.asarray(domain)[start:stop]
        v = x @ self.theta_hat_
        meta = {"theta_hat": self.theta_hat_.tolist()}
        if "domains" in data.meta:
            meta["domains"] = list(data.meta["domains"])
        return ModelOutputs(
            features=x.astype(np.float32),
            logits=np.stack([-v, v], axis=1).astype(np.float32),
            labels=labels,
            domain=domain,
            meta=meta,
        )


PLUGIN = Plugin(
    "theory-linear",
    TheoryLinear,
    summary="The paper's theory classifier: θ̂ = mean(x·y) on 'train', logits [−θ̂ᵀx, θ̂ᵀx]",
)
