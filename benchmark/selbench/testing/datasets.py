"""Checks of datasets: the split contract (labels, inputs of the declared input kind,
domain), determinism and unknown split names; a dataset whose files are absent skips them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from selbench.contract.api import SplitData
from selbench.contract.data import ModelOutputs

from .errors import Broken, CheckSkipped
from .support import (
    Subject,
    brief,
    call,
    diff,
    equal,
    expect_array,
    fmt_exc,
    register_check,
)


def _dataset(s: Subject) -> Any:
    try:
        return s.factory()
    except FileNotFoundError as exc:
        raise CheckSkipped(f"data not available: {fmt_exc(exc)}") from exc
    except Exception as exc:
        raise Broken(f"building the plugin raised {fmt_exc(exc)}") from exc


def _attr(ds: Any, name: str) -> Any:
    """``ds.<name>`` (None when absent); a missing data file skips the check."""
    try:
        return getattr(ds, name, None)
    except FileNotFoundError as exc:
        raise CheckSkipped(f"data not available: {fmt_exc(exc)}") from exc
    except Exception as exc:
        raise Broken(f"reading {name} raised {fmt_exc(exc)}") from exc


def _split(ds: Any, name: str) -> Any:
    try:
        return ds.split(name)
    except FileNotFoundError as exc:
        raise CheckSkipped(f"data not available: {fmt_exc(exc)}") from exc
    except Exception as exc:
        raise Broken(f"split({name!r}) raised {fmt_exc(exc)}") from exc


def _splits(ds: Any) -> list[str]:
    try:
        names = ds.splits()
    except FileNotFoundError as exc:
        raise CheckSkipped(f"data not available: {fmt_exc(exc)}") from exc
    except Exception as exc:
        raise Broken(f"splits() raised {fmt_exc(exc)}") from exc
    if not isinstance(names, (list, tuple)) or not names \
            or not all(isinstance(n, str) for n in names):
        raise Broken(f"splits() returned {names!r}, expected a non-empty list of split names")
    if len(set(names)) != len(names):
        raise Broken(f"splits() names a split twice: {list(names)}")
    return list(names)


@register_check("dataset")
def check_dataset_splits(s: Subject) -> None:
    """``splits()`` is a non-empty list of distinct names and ``num_classes`` an integer
    K >= 2."""
    ds = _dataset(s)
    _splits(ds)
    k = _attr(ds, "num_classes")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 2:
        raise Broken(f"num_classes is {k!r}, expected an integer K >= 2")


@register_check("dataset")
def check_dataset_split_contract(s: Subject) -> None:
    """Every ``split(name)`` returns a ``SplitData`` whose ``labels`` are an integer array
    ``[N]`` in [0, K), whose ``inputs`` hold N examples of the declared ``input_kind``
    (``vectors``: a float array ``[N, p]``; ``text``: N ``str`` sentences; ``image-array``:
    a numeric array ``[N, C, H, W]`` or ``[N, H, W]``; ``model-outputs``: ``ModelOutputs`` with these labels; ``image-items``:
    a dataset of ``(uint8 [3, H, W] tensor, label)`` items) and whose ``domain`` is None or
    ``[N]``. A missing file raises ``FileNotFoundError`` (the check is then skipped)."""
    ds = _dataset(s)
    k = int(_attr(ds, "num_classes") or 0)
    kind = getattr(type(ds), "input_kind", None)
    for name in _splits(ds):
        where = f"split({name!r})"
        data = _split(ds, name)
        if not isinstance(data, SplitData):
            raise Broken(f"{where} returned {brief(data)}, expected a selbench.SplitData")
        labels = data.labels
        if not isinstance(labels, np.ndarray) or labels.ndim != 1 \
                or not np.issubdtype(labels.dtype, np.integer):
            raise Broken(f"{where}.labels is {brief(labels)}, expected an integer ndarray [N]")
        n = len(labels)
        expect_array(f"{where}.labels", labels.astype(np.int64), n, np.int64, classes=k)
        try:
            count = len(data.inputs)
        except TypeError:
            count = None
        if count != n:
            raise Broken(f"{where}.inputs holds {count} examples but labels {n}")
        if data.domain is not None and np.shape(data.domain) != (n,):
            raise Broken(f"{where}.domain has shape {np.shape(data.domain)}, expected ({n},)")
        _check_input_kind(where, kind, data, n)


def _check_input_kind(where: str, kind: str | None, data: SplitData, n: int) -> None:
    x = data.inputs
    if kind == "vectors":
        if not (isinstance(x, np.ndarray) and x.ndim == 2
                and np.issubdtype(x.dtype, np.floating)):
            raise Broken(f"{where}.inputs is {brief(x)}; input_kind 'vectors' means a float "
                         f"ndarray [N, p]")
    elif kind == "image-array":
        if not (isinstance(x, np.ndarray) and x.ndim in (3, 4)
                and np.issubdtype(x.dtype, np.number)):
            raise Broken(f"{where}.inputs is {brief(x)}; input_kind 'image-array' means a "
                         "numeric ndarray [N, C, H, W] or [N, H, W]")
    elif kind == "text":
        if isinstance(x, np.ndarray):
            ok = x.ndim == 1 and all(isinstance(v, str) for v in x.tolist())
        else:
            ok = isinstance(x, (list, tuple)) and all(isinstance(v, str) for v in x)
        if not ok:
            raise Broken(f"{where}.inputs is {brief(x)}; input_kind 'text' means N sentences "
                         "(a 1-D array or list of str)")
    elif kind == "model-outputs":
        if not isinstance(x, ModelOutputs):
            raise Broken(f"{where}.inputs is {brief(x)}; input_kind 'model-outputs' means "
                         "selbench.ModelOutputs")
        if not equal(x.labels, data.labels):
            raise Broken(f"{where}.inputs.labels differ from {where}.labels "
                         f"({diff(x.labels, data.labels)})")
    elif kind == "image-items" and n:
        import torch

        item = call(f"{where}.inputs[0]", x.__getitem__, 0)
        ok = (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], torch.Tensor)
              and item[0].dtype == torch.uint8 and item[0].dim() == 3 and item[0].shape[0] == 3)
        if not ok:
            raise Broken(f"{where}.inputs[0] is {brief(item)}; input_kind 'image-items' means "
                         "(uint8 tensor [3, H, W], int label) items")
        if int(item[1]) != int(data.labels[0]):
            raise Broken(f"{where}.inputs[0] has label {int(item[1])} but labels[0] is "
                         f"{int(data.labels[0])}")


@register_check("dataset")
def check_dataset_is_deterministic(s: Subject) -> None:
    """Two datasets built with the same params give the same labels (and array inputs) in
    every split."""
    first, second = _dataset(s), _dataset(s)
    for name in _splits(first):
        a, b = _split(first, name), _split(second, name)
        if not equal(a.labels, b.labels):
            raise Broken(f"two builds gave different split({name!r}).labels "
                         f"({diff(a.labels, b.labels)})")
        if isinstance(a.inputs, np.ndarray) and not equal(a.inputs, b.inputs):
            raise Broken(f"two builds gave different split({name!r}).inputs "
                         f"({diff(a.inputs, b.inputs)})")


@register_check("dataset")
def check_dataset_rejects_unknown_split(s: Subject) -> None:
    """``split(name)`` for a name not in ``splits()`` raises a ``KeyError`` or ``ValueError``
    whose message names the split."""
    ds = _dataset(s)
    _splits(ds)
    try:
        result = ds.split("no-such-split")
    except FileNotFoundError as exc:
        raise Broken(f"split('no-such-split') raised {fmt_exc(exc)}; expected a KeyError or "
                     "ValueError naming the split") from exc
    except (KeyError, ValueError) as exc:
        if "no-such-split" not in str(exc):
            raise Broken(f"split('no-such-split') raised {fmt_exc(exc)}, whose message does not "
                         "name the split") from exc
        return
    except Exception as exc:
        raise Broken(f"split('no-such-split') raised {fmt_exc(exc)}; expected a KeyError or "
                     "ValueError naming the split") from exc
    raise Broken(f"split('no-such-split') returned {brief(result)} instead of raising a "
                 "KeyError or ValueError")


