"""Helpers shared by the built-in recalibrators (private): equal-mass binning and fitting
equal recalibrators once."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
from selbench.data import ModelOutputs
from selbench.torchutils import equal_groups

__all__ = ["bin_means", "equal_mass_edges", "fit_once_per_data", "lookup_bins"]

def fit_once_per_data(recalibrators: Sequence[Any], outputs: Sequence[ModelOutputs],
                      contexts: Sequence[Any]) -> None:
    """``recalibrators[i].fit(outputs[i], contexts[i])`` for recalibrators whose fit is a
    deterministic function of their parameters and the data alone (it reads neither the seed
    nor β): equal parameters on equal logits and labels (the training β's of one seed, in a
    leaderboard) are fitted once and the learned attributes (``*_``) deep-copied; the
    recalibrators' :meth:`~selbench.api.Recalibrator.fit_many`."""
    groups = equal_groups(
        [0] * len(recalibrators),
        lambda a, b: type(recalibrators[a]) is type(recalibrators[b])
        and recalibrators[a].get_params(deep=False) == recalibrators[b].get_params(deep=False)
        and np.array_equal(outputs[a].logits, outputs[b].logits)
        and np.array_equal(outputs[a].labels, outputs[b].labels),
    )
    for group in groups:
        first = recalibrators[group[0]]
        first.fit(outputs[group[0]], contexts[group[0]])
        learned = {k: v for k, v in vars(first).items() if k.endswith("_")}
        for j in group[1:]:
            vars(recalibrators[j]).update(copy.deepcopy(learned))


def equal_mass_edges(values: np.ndarray, n_bins: int) -> np.ndarray:
    """Upper bin boundaries of equal-mass bins over ``values`` in [0, 1].

    The sorted values are cut into ``min(n_bins, N)`` consecutive groups whose sizes differ
    by at most one (the first ``N mod n_bins`` groups get the extra element); each inner
    boundary is the midpoint between the last value of one group and the first of the
    next, and the last boundary is 1.0. Repeated boundaries (ties) are merged, so fewer
    bins may result. This is the convention of Kumar et al.'s ``calibration`` package
    (``get_equal_bins``); a value ``v`` falls in the first bin whose boundary is ``>= v``.
    """
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = v.shape[0]
    k = max(1, min(int(n_bins), n))
    sizes = np.full(k, n // k)
    sizes[: n % k] += 1
    ends = np.cumsum(sizes)  # one past the last index of each group
    inner = (v[ends[:-1] - 1] + v[ends[:-1]]) / 2.0
    return np.unique(np.concatenate([inner, [1.0]]))


def lookup_bins(edges: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index of the bin of each value (first edge ``>= value``; values above 1 go last)."""
    idx = np.searchsorted(edges, np.asarray(values, dtype=np.float64), side="left")
    return np.minimum(idx, len(edges) - 1)


def bin_means(edges: np.ndarray, values: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Mean of ``targets`` per bin of ``values``; an empty bin gets its midpoint."""
    idx = lookup_bins(edges, values)
    nb = len(edges)
    counts = np.bincount(idx, minlength=nb).astype(np.float64)
    sums = np.bincount(idx, weights=np.asarray(targets, dtype=np.float64), minlength=nb)
    lower = np.concatenate([[0.0], edges[:-1]])
    mid = (lower + edges) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1.0), mid)
    return means
