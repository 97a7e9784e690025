"""What :class:`~selbench.library.estimator.SelectiveRecalibrator` reads from a user besides
arrays of logits: labels of any hashable type (encoded as the logit columns' indices, the
``classes_`` convention of scikit-learn), a fitted scikit-learn classifier whose outputs are
the logits, and the full recalibrated distribution of a recalibrator that defines one.

* **Labels.** The logits' column ``j`` is class ``classes_[j]``. Without ``classes``, integer
  labels all in ``[0, K)`` mean the columns themselves (``classes_ = arange(K)``, as before);
  any other labels (strings, or integers outside ``[0, K)``) are sorted as
  :func:`numpy.unique` sorts them, as scikit-learn's classifiers set ``classes_``, and must
  then number exactly K.
* **A classifier.** Its logits are ``decision_function(X)`` when it has one (a binary
  classifier's ``[N]`` scores ``d`` become the logits ``[0, d]``, whose softmax is
  ``[1 - sigmoid(d), sigmoid(d)]``: exactly logistic regression's probabilities), else
  ``log(predict_proba(X))`` with probabilities floored at float32's smallest normal number
  (about ``1.2e-38``, so a zero stays finite); its ``classes_`` name the columns.
* **The recalibrated distribution.** A recalibrator defines one when it declares
  ``provides_log_probs = True`` and is a
  :class:`~selbench.contract.api.DifferentiableRecalibrator`: the second output of its module
  (:class:`~selbench.contract.api.RecalibratorModule`), the full log-probability vector. For
  temperature scaling that is ``log_softmax(z / T)``; for the top-label recalibrators (Platt,
  beta) the recalibrated confidence on the predicted class and the rest shared among the
  other classes in proportion to their original probabilities.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from selbench.contract.api import FitContext
from selbench.contract.data import DataError

__all__ = ["DistributionError", "check_classifier", "classifier_logits", "decode", "encode",
           "fit_classes", "log_probabilities", "provides_distribution"]


class DistributionError(ValueError):
    """The recalibrator defines no full distribution (it declares no log-probabilities)."""


# --------------------------------------------------------------------------- labels
def fit_classes(labels: Any, k: int, classes: Any = None) -> np.ndarray:
    """The label of each of the ``k`` logit columns (see the module docstring); a
    :class:`~selbench.DataError` naming ``labels`` or ``classes`` when they cannot be."""
    if classes is not None:
        cls = np.asarray(classes)
        if cls.ndim != 1 or cls.shape[0] != k:
            raise DataError(f"classes: expected one label per logit column ({k}), got shape "
                            f"{cls.shape}")
        if len(set(cls.tolist())) != k:
            raise DataError("classes: the labels of the logit columns must be distinct")
        return cls
    lab = _as_labels(labels)
    integral = lab.dtype.kind in "iub" or (lab.dtype.kind == "f" and bool(np.all(lab == np.round(lab))))
    if integral and (lab.size == 0 or (lab.min() >= 0 and lab.max() < k)):
        return np.arange(k)
    try:
        cls = np.unique(lab)
    except TypeError:
        raise DataError("labels: cannot be sorted (mixed types?); pass classes=[...] naming "
                        "each logit column") from None
    if cls.shape[0] != k and integral:
        raise DataError(f"labels: values must lie in [0, {k}) (the logit columns), or be {k} "
                        f"distinct labels taken in sorted order; got {cls.shape[0]} distinct "
                        f"({_show(cls)}); pass classes=[...] naming each logit column")
    if cls.shape[0] != k:
        raise DataError(f"labels: {cls.shape[0]} distinct labels ({_show(cls)}) but the logits "
                        f"have K={k} columns; pass classes=[...] naming each logit column")
    return cls


def _as_labels(labels: Any) -> np.ndarray:
    lab = np.asarray(labels)
    if lab.ndim != 1:
        raise DataError(f"labels: expected a 1-D array [N], got shape {lab.shape}")
    return lab


def _show(values: np.ndarray, n: int = 5) -> str:
    shown = ", ".join(repr(v) for v in values[:n].tolist())
    return shown + (", ..." if values.shape[0] > n else "")


def encode(labels: Any, classes: np.ndarray) -> np.ndarray:
    """``labels`` as the int64 indices of their logit columns in ``classes``; a
    :class:`~selbench.DataError` naming the first label that is not a class."""
    lab = _as_labels(labels)
    k = classes.shape[0]
    if classes.dtype.kind in "iu" and np.array_equal(classes, np.arange(k)) \
            and lab.dtype.kind in "iub":
        idx = lab.astype(np.int64)
        bad = np.flatnonzero((idx < 0) | (idx >= k))
    else:
        index = {c: i for i, c in enumerate(classes.tolist())}
        idx = np.fromiter((index.get(v, -1) for v in lab.tolist()), dtype=np.int64,
                          count=lab.shape[0])
        bad = np.flatnonzero(idx < 0)
    if bad.size:
        i = int(bad[0])
        raise DataError(f"labels: labels[{i}] = {lab[i].item()!r} is not one of the classes fitted "
                        f"({_show(classes)})")
    return idx


def decode(indices: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Column indices as the labels they name (``classes[indices]``)."""
    return classes[np.asarray(indices, dtype=np.int64)]


# --------------------------------------------------------------------------- classifier
def classifier_logits(classifier: Any, inputs: Any) -> np.ndarray:
    """The logits a fitted scikit-learn classifier gives ``inputs`` (module docstring),
    float32 ``[N, K]`` with K = ``len(classifier.classes_)``."""
    classes = getattr(classifier, "classes_", None)
    if classes is None:
        raise DataError(f"classifier: {type(classifier).__name__} has no classes_ (is it a "
                        "fitted scikit-learn classifier?)")
    k = len(classes)
    if hasattr(classifier, "decision_function"):
        d = np.asarray(classifier.decision_function(inputs), dtype=np.float64)
        if d.ndim == 1 and k == 2:
            d = np.stack([np.zeros_like(d), d], axis=1)
        what = "decision_function"
    elif hasattr(classifier, "predict_proba"):
        p = np.asarray(classifier.predict_proba(inputs), dtype=np.float64)
        d = np.log(np.maximum(p, np.finfo(np.float32).tiny))
        what = "predict_proba"
    else:
        raise DataError(f"classifier: {type(classifier).__name__} has neither "
                        "decision_function nor predict_proba")
    if d.ndim != 2 or d.shape[1] != k:
        raise DataError(f"classifier: {type(classifier).__name__}.{what} returned shape "
                        f"{d.shape}, expected [N, {k}] (one column per class)")
    return d.astype(np.float32)


def check_classifier(classifier: Any) -> None:
    """A fitted scikit-learn classifier, or a ``ValueError`` naming ``classifier``."""
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted

    if not (hasattr(classifier, "decision_function") or hasattr(classifier, "predict_proba")):
        raise ValueError(f"classifier: expected a fitted scikit-learn classifier (with "
                         f"decision_function or predict_proba), got "
                         f"{type(classifier).__name__}")
    try:
        check_is_fitted(classifier)
    except NotFittedError:
        raise ValueError(f"classifier: {type(classifier).__name__} is not fitted; fit it on "
                         "its training data first (selbench never fits it)") from None
    except TypeError as exc:
        raise ValueError(f"classifier: {exc}") from None


# --------------------------------------------------------------------------- distribution
def provides_distribution(recalibrator: Any) -> bool:
    """Whether ``recalibrator`` defines a full recalibrated distribution: it declares
    ``provides_log_probs = True`` and has a ``module`` (a differentiable recalibrator)."""
    return (getattr(recalibrator, "provides_log_probs", None) is True
            and callable(getattr(recalibrator, "module", None)))


def log_probabilities(recalibrator: Any, outputs: Any, name: str,
                      device: Any = "cpu") -> np.ndarray:
    """The recalibrated log-probabilities float64 ``[N, K]`` of a fitted recalibrator that
    :func:`provides_distribution` (its module's second output, on ``device``); a
    :class:`DistributionError` naming it (``name``) otherwise, a ``ValueError`` naming it
    when the module returns something else."""
    from selbench.training.torchutils import run_module

    if not provides_distribution(recalibrator):
        raise DistributionError(
            f"{name} defines no recalibrated distribution (it does not declare "
            "provides_log_probs = True on a DifferentiableRecalibrator): only its top-label "
            "confidence is defined (predict_confidence)")
    module = recalibrator.module(outputs, FitContext(device=device))
    logp = run_module(module, outputs.logits, outputs.features, index=1)
    n, k = len(outputs), outputs.num_classes
    if logp.shape != (n, k) or not np.all(np.isfinite(logp) | (logp == -np.inf)) \
            or (n and np.nanmax(logp) > 1e-4):
        raise ValueError(f"{name}: its module's log-probabilities have shape {logp.shape} or "
                         f"values that are not log-probabilities; expected [{n}, {k}] <= 0")
    return logp
