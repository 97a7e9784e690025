"""``venn-abers``: the inductive Venn–Abers predictor (Vovk, Petej & Fedorova, NeurIPS 2015)
of the top label: correctness against the top-label confidence, as the ``venn-abers``
package's ``VennAbers`` computes it on binary scores.

For a test confidence ``s`` the predictor fits isotonic regression twice, to the fitting
pairs (confidence, correct) plus ``(s, 0)`` and plus ``(s, 1)``, and reads both fits at
``s``: ``p0 <= p1``, a multiprobability that holds the calibrated probability of being right
(the Venn prediction is valid: one of the two is calibrated). The point confidence merges
them as the package does, ``p = p1 / (1 - p0 + p1)`` (the minimiser of the worst-case log
loss, Vovk et al.'s Sec. 4). Both fits depend on ``s`` only through where it falls among the
sorted distinct fitting confidences ``c_1 < ... < c_m``: ``p1`` is the same for all ``s`` in
``(c_{j-1}, c_j]`` (a label 1 tied with ``c_j`` pools as one just below it) and ``p0`` for
all ``s`` in ``[c_j, c_{j+1})``. ``fit`` therefore computes the ``m + 1`` values of each from
the cumulative sum diagram of the fitting data with Vovk et al.'s Algorithms 1–4 (the
greatest convex minorant kept on a stack as the test point moves right, in exact integer
arithmetic): ``O(m)`` after sorting, where a refit per test point costs ``O(n)`` each.
``confidence`` then looks ``s`` up with two binary searches.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from selbench.contract.api import FitContext, Recalibrator
from selbench.contract.checks import NotFittedError, check_outputs
from selbench.contract.data import ModelOutputs

from ._common import fit_once_per_data
from .binning import top_label

__all__ = ["VennAbersPredictor", "venn_abers_interval", "venn_abers_table"]


def _label_one_values(weights: np.ndarray, positives: np.ndarray) -> np.ndarray:
    """``F1 [m + 1]``: entry ``j`` is the isotonic fit at a test point of label 1 pooled
    with group ``j`` (0-based) of the sorted groups of ``weights`` examples, ``positives``
    of them labelled 1; entry ``m`` (after the last group) is 1.

    Vovk et al.'s Algorithms 1 and 2 on the cumulative sum diagram ``P_0 = (0, 0)``, ``P_i =
    (cumulative weight, cumulative positives)`` and ``P_{-1} = (-1, -1)``: for the test
    point in group ``i``, the points left of it move by ``(-1, -1)`` (which is the same as
    moving the rest by ``(1, 1)``), and the fit is the slope of the greatest convex minorant
    on the segment that starts at the last moved point."""
    xs = [-1, 0, *np.cumsum(weights).tolist()]  # xs[i + 1] = P_i
    ys = [-1, 0, *np.cumsum(positives).tolist()]
    m = len(xs) - 2
    # Algorithm 1: the corners of the minorant of P_{-1}, ..., P_m (a stack, left to right)
    hull: list[tuple[int, int]] = [(xs[0], ys[0]), (xs[1], ys[1])]
    for i in range(2, m + 2):
        x, y = xs[i], ys[i]
        while len(hull) > 1:
            (ax, ay), (bx, by) = hull[-2], hull[-1]
            if (bx - ax) * (y - by) - (by - ay) * (x - bx) > 0:  # a left turn: keep
                break
            hull.pop()
        hull.append((x, y))
    # Algorithm 2: move the test point right; the stack's top is the segment's left end
    stack = hull[::-1]
    out = np.ones(m + 1)
    for i in range(1, m + 1):  # the test point pooled with group i (1-based)
        (tx, ty), (nx, ny) = stack[-1], stack[-2]
        out[i - 1] = (ny - ty) / (nx - tx)
        # P_{i-1} moves by (-1, -1): P_{i-1} := P_{i-2} + P_i - P_{i-1}
        px = xs[i - 1] + xs[i + 1] - xs[i]
        py = ys[i - 1] + ys[i + 1] - ys[i]
        xs[i], ys[i] = px, py
        if (nx - tx) * (py - ty) - (ny - ty) * (px - tx) >= 0:  # not below the segment
            continue
        stack.pop()
        while len(stack) > 1:
            (bx, by), (cx, cy) = stack[-1], stack[-2]
            if (bx - px) * (cy - by) - (by - py) * (cx - bx) > 0:
                break
            stack.pop()
        stack.append((px, py))
    return out


def venn_abers_table(scores: np.ndarray, labels: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(c, p0, p1)`` of the fitting ``scores`` and 0/1 ``labels``: the sorted distinct
    scores ``c [m]`` and the values ``p0 [m + 1]``, ``p1 [m + 1]`` of the two isotonic fits
    for a test score ``s``: ``p0[searchsorted(c, s, 'right')]`` and ``p1[searchsorted(c, s,
    'left')]`` (the layout of the ``venn-abers`` package's ``calc_p0p1``)."""
    scores = np.asarray(scores, dtype=np.float64)
    c, inverse = np.unique(scores, return_inverse=True)
    weights = np.bincount(inverse, minlength=len(c))
    positives = np.bincount(inverse, weights=np.asarray(labels, dtype=np.float64),
                            minlength=len(c)).round().astype(np.int64)
    p1 = _label_one_values(weights, positives)
    # p0 is p1 of the mirrored problem (scores reversed, labels flipped): 1 - F1'
    p0 = 1.0 - _label_one_values(weights[::-1], (weights - positives)[::-1])[::-1]
    return c, p0, p1


def venn_abers_interval(table: tuple[np.ndarray, np.ndarray, np.ndarray],
                        scores: np.ndarray) -> np.ndarray:
    """``[p0, p1]`` per test score, float64 ``[N, 2]``, from :func:`venn_abers_table`.

    One binary search: ``searchsorted(c, s, 'right')`` is the ``'left'`` index plus one
    where ``s`` equals that fitting score (the scores ``c`` are distinct)."""
    c, p0, p1 = table
    s = np.asarray(scores, dtype=np.float64)
    left = np.searchsorted(c, s, side="left")
    right = left + (c[np.minimum(left, len(c) - 1)] == s)
    out = np.empty((len(s), 2))
    np.take(p0, right, out=out[:, 0])
    np.take(p1, left, out=out[:, 1])
    return out


class VennAbersPredictor(Recalibrator):
    """Inductive Venn–Abers predictor of the top label (Vovk, Petej & Fedorova, NeurIPS 2015): p1 / (1 - p0 + p1) of two isotonic fits per test point.

    ``fit`` takes the top-label confidence ``max softmax(logits)`` and whether the
    prediction ``argmax(logits)`` is right; for a test confidence the two isotonic
    regressions of correctness, with the test point added as wrong and as right, give ``p0
    <= p1`` and the recalibrated confidence is ``p1 / (1 - p0 + p1)`` (the ``venn-abers``
    package's ``VennAbers`` on the scores ``[1 - conf, conf]``; see :mod:`.vennabers` for
    how all of them are precomputed in ``O(n)``). :meth:`confidence_interval` returns the
    ``[p0, p1]`` it carries. Learned state: ``scores_`` (the distinct fitting confidences),
    ``p0_``, ``p1_`` (the fits' values around them). Not differentiable: the prediction
    never changes.
    """

    reference: ClassVar[str] = (
        "Vovk, Petej & Fedorova, Large-scale probabilistic predictors with and without "
        "guarantees of validity, NeurIPS 2015; the venn-abers package (Petej)")
    usable_unfitted = False

    @classmethod
    def fit_many(cls, recalibrators, outputs, contexts) -> None:
        """Fit each of ``recalibrators`` on its ``outputs`` as :meth:`fit` would; the fit
        depends on the logits and labels only, so equal data are fitted once and copied."""
        fit_once_per_data(recalibrators, outputs, contexts)

    def fit(self, outputs: ModelOutputs, context: FitContext) -> VennAbersPredictor:
        check_outputs(outputs, "recalibrator 'venn-abers'", min_rows=1)
        conf, correct = top_label(outputs)
        self.scores_, self.p0_, self.p1_ = venn_abers_table(conf, correct)
        return self

    def confidence_interval(self, outputs: ModelOutputs) -> np.ndarray:
        """The Venn–Abers interval ``[p0, p1]`` of each example's top-label confidence,
        float64 ``[N, 2]`` (``p0 <= confidence <= p1``)."""
        check_outputs(outputs, "recalibrator 'venn-abers'")
        if getattr(self, "p1_", None) is None:
            raise NotFittedError("recalibrator 'venn-abers' is not fitted; call fit first")
        conf, _ = top_label(outputs)
        return venn_abers_interval((self.scores_, self.p0_, self.p1_), conf)

    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        """``p1 / (1 - p0 + p1)`` of :meth:`confidence_interval`."""
        interval = self.confidence_interval(outputs)
        p0, p1 = interval[:, 0], interval[:, 1]
        return np.clip(p1 / (1.0 - p0 + p1), 0.0, 1.0)
