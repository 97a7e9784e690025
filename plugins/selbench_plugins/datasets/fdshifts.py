"""``fd-shifts``: the test outputs of one FD-Shifts experiment, each test set a split.

FD-Shifts (Jaeger, Lüth, Klein & Bungert, *A call to reflect on evaluation practices for
failure detection in image classification*, ICLR 2023; https://github.com/IML-DKFZ/fd-shifts)
evaluates confidence scores under many real shifts (sub-class, corruption, new-class,
domain). Its test run writes, per experiment, the model's outputs on every test set; this
plugin reads them as FD-Shifts' own analysis does, so that each experiment gives
selective-recalibration experiments under its shifts.

The format (read from ``fd_shifts/analysis/__init__.py`` (``ExperimentData.from_experiment``),
``fd_shifts/analysis/studies.py`` and ``fd_shifts/models/callbacks/confid_monitor.py``
(``on_test_end``) of IML-DKFZ/fd-shifts): the experiment's ``test_results/`` folder holds

* ``raw_logits.npz`` (or, from older runs, ``raw_output.npz`` with softmax outputs in place
  of logits): one array ``arr_0`` (``np.savez_compressed`` of a single array) of shape
  ``[N, K + 2]``: the K logits, then the label, then the index of the test set the row came
  from (``dataset_idx``), in the precision the run was configured with (float16/32/64);
* ``encoded_output.npz`` (optional): ``arr_0`` ``[N, D + 1]``, the D-dimensional encoding
  (penultimate layer, float16) and ``dataset_idx``, row for row with the above;
* ``external_confids.npz`` and the Monte-Carlo-dropout ``*_dist.npz`` files (not read).

``dataset_idx`` counts FD-Shifts' test data loaders: 0 is ``val_tuning`` (its validation
set, which FD-Shifts' analysis requires), then the test sets of the experiment's
``eval.query_studies`` in order (``iid_study``, then each of ``in_class_study``,
``noise_study``, ``new_class_study``...). Give their names with ``sets`` (index order,
``val_tuning`` first); without it the splits are ``val_tuning``, ``set1``, ``set2``, ....
A set named in ``noise_sets`` holds FD-Shifts' corruption layout (15 corruptions x 5
intensities x n images, in that order) and also gets one split per intensity,
``<name>-1`` ... ``<name>-5``, as FD-Shifts' noise study reads it; its rows' ``domain`` is
the corruption (0-14) x 5 + the intensity (0-4); every other row's ``domain`` is its set
index.

Splits the arena fits and evaluates on: ``fit_split: val_tuning`` with ``n_fit`` below its
size (every seed draws its own fitting rows), ``eval_split`` the i.i.d. test set or a shifted
one. New-class sets hold labels outside the model's classes: selective recalibration needs
the true class, so such a split is refused in one line naming it. Features are the encoding
when ``encoded_output.npz`` is there (``features: encoded``), else the softmax vector.

What a user with internet does: run FD-Shifts (``fd-shifts train`` then ``fd-shifts test``
for an experiment; its README lists the datasets and models) or take the ``test_results/``
of an existing run, then point an experiment at it::

    dataset:
      name: fd-shifts
      params:
        folder: experiments/cifar10_paper_sweep/confidnet_bbvgg13_do1_run1_rew2.2/test_results
        sets: [val_tuning, cifar10, corrupt_cifar10, svhn, tinyimagenet_resize]
        noise_sets: [corrupt_cifar10]
    backbone: {name: precomputed}
    fit_split: val_tuning
    eval_split: corrupt_cifar10-3
    n_fit: 1000
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, Field
from selbench.contract.api import Dataset, Plugin, SplitData
from selbench.contract.data import DataError, ModelOutputs
from selbench.contract.inputs import InputDir

__all__ = ["OUTPUT_FILES", "PLUGIN", "FDShifts", "MissingFDShiftsOutputs"]

#: the files of a test_results folder this plugin reads, in the order FD-Shifts prefers them
OUTPUT_FILES: tuple[str, ...] = ("raw_logits.npz", "raw_output.npz")
ENCODED_FILE = "encoded_output.npz"
#: FD-Shifts' corruption sets: 15 corruptions x 5 intensities (fd_shifts/analysis/studies.py)
N_CORRUPTIONS, N_INTENSITIES = 15, 5


#: the files hashed by content in the folder's digest (the folder, or the experiment's folder)
_DIGESTED = tuple(f"{d}{name}" for d in ("", "test_results/")
                  for name in (*OUTPUT_FILES, ENCODED_FILE))


class MissingFDShiftsOutputs(DataError, FileNotFoundError):
    """The folder has no outputs file (a :class:`DataError`, and a ``FileNotFoundError``)."""


def _distinct(v: list[str] | None) -> list[str] | None:
    if v is not None and (not v or len(set(v)) != len(v)):
        raise ValueError("must be a non-empty list of distinct names")
    return v


def _no_repeats(v: list[str]) -> list[str]:
    if len(set(v)) != len(v):
        raise ValueError("must not name a set twice")
    return v


def _load_arr0(path: Path) -> np.ndarray:
    """``arr_0`` of an ``.npz`` written by ``np.savez_compressed(path, array)``."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if "arr_0" not in z.files:
                raise DataError(f"fd-shifts: {path}: no array 'arr_0' (FD-Shifts writes the "
                                f"outputs as the single unnamed array); it holds "
                                f"{', '.join(z.files) or 'no arrays'}")
            return z["arr_0"]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"fd-shifts: {path}: not a readable .npz ({type(exc).__name__}: "
                        f"{exc})") from exc


class FDShifts(Dataset):
    """The test sets of one FD-Shifts experiment as :class:`ModelOutputs` splits."""

    input_kind = "model-outputs"

    def __init__(
        self,
        folder: Annotated[InputDir(metadata=_DIGESTED), Field(
            description="the experiment's test_results folder (or the experiment folder "
            "holding test_results/): raw_logits.npz or raw_output.npz",
        )],
        sets: Annotated[list[str] | None, AfterValidator(_distinct), Field(
            description="names of dataset_idx 0, 1, ...: val_tuning, then the test sets of "
            "eval.query_studies in order (default: val_tuning, set1, set2, ...)",
        )] = None,
        noise_sets: Annotated[list[str], AfterValidator(_no_repeats), Field(
            description="sets in FD-Shifts' corruption layout (15 corruptions x 5 "
            "intensities): also split by intensity, <name>-1 ... <name>-5",
        )] = [],  # noqa: B006 - parameters are never mutated
        features: Annotated[Literal["encoded", "probabilities"], Field(
            description="the selector's features: the encoding of encoded_output.npz when "
            "present (encoded), or the softmax vector",
        )] = "encoded",
    ):
        self.folder = folder
        self.sets = sets
        self.noise_sets = noise_sets
        self.features = features
        self._loaded: dict[str, Any] | None = None

    # ------------------------------------------------------------------ reading
    def _dir(self) -> Path:
        root = Path(self.folder)
        return root / "test_results" if (root / "test_results").is_dir() else root

    def _outputs_file(self) -> Path:
        d = self._dir()
        for name in OUTPUT_FILES:
            if (d / name).is_file():
                return d / name
        raise MissingFDShiftsOutputs(
            f"fd-shifts: {d}: no {' or '.join(OUTPUT_FILES)} (the outputs `fd-shifts test` "
            "writes into the experiment's test_results folder)")

    def _raw(self) -> tuple[np.ndarray, Path]:
        path = self._outputs_file()
        raw = _load_arr0(path)
        if raw.ndim != 2 or raw.shape[1] < 4:
            raise DataError(f"fd-shifts: {path}: arr_0 has shape {raw.shape}, expected "
                            "[N, K + 2] (K class scores, the label, the dataset index)")
        return raw, path

    def _names(self, n_sets: int, path: Path) -> list[str]:
        names = self.sets or ["val_tuning"] + [f"set{i}" for i in range(1, n_sets)]
        if len(names) < n_sets:
            raise DataError(f"fd-shifts: {path}: dataset_idx runs to {n_sets - 1} but sets "
                            f"names only {len(names)} sets ({', '.join(names)})")
        unknown = [s for s in self.noise_sets if s not in names]
        if unknown:
            raise DataError(f"fd-shifts: noise_sets names {unknown}, which are not among the "
                            f"sets {', '.join(names)}")
        return names

    def _load(self) -> dict[str, Any]:
        if self._loaded is not None:
            return self._loaded
        raw, path = self._raw()
        scores = raw[:, :-2].astype(np.float32)
        labels = raw[:, -2].astype(np.float64)
        set_idx = raw[:, -1].astype(np.float64)
        if not np.all(np.mod(set_idx, 1) == 0) or set_idx.min() < 0:
            raise DataError(f"fd-shifts: {path}: the last column (dataset_idx) must hold "
                            "non-negative integers")
        set_idx = set_idx.astype(np.int64)
        names = self._names(int(set_idx.max()) + 1, path)
        softmax = path.name == "raw_output.npz"
        feats = self._encoded(len(raw))
        index, domain = self._index(set_idx, names, path)
        self._loaded = {"path": path, "scores": scores, "softmax": softmax, "labels": labels,
                        "features": feats, "index": index, "domain": domain}
        return self._loaded

    def _encoded(self, n: int) -> np.ndarray | None:
        path = self._dir() / ENCODED_FILE
        if self.features != "encoded" or not path.is_file():
            return None
        enc = _load_arr0(path)
        if enc.ndim != 2 or enc.shape[0] != n or enc.shape[1] < 2:
            raise DataError(f"fd-shifts: {path}: arr_0 has shape {enc.shape}, expected "
                            f"[{n}, D + 1] (the encoding and the dataset index, row for row "
                            "with the outputs)")
        return enc[:, :-1].astype(np.float32)

    def _index(self, set_idx: np.ndarray, names: list[str],
               path: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
        index: dict[str, np.ndarray] = {}
        domain = set_idx.copy()
        for i, name in enumerate(names):
            rows = np.flatnonzero(set_idx == i)
            if not rows.size:
                continue
            index[name] = rows
            if name not in self.noise_sets:
                continue
            per, rest = divmod(rows.size, N_CORRUPTIONS * N_INTENSITIES)
            if rest:
                raise DataError(
                    f"fd-shifts: {path}: noise set {name!r} has {rows.size} rows, not a "
                    f"multiple of {N_CORRUPTIONS} corruptions x {N_INTENSITIES} intensities")
            grid = rows.reshape(N_CORRUPTIONS, N_INTENSITIES, per)
            for level in range(N_INTENSITIES):
                index[f"{name}-{level + 1}"] = np.sort(grid[:, level].reshape(-1))
            domain[rows] = (np.arange(N_CORRUPTIONS)[:, None, None] * N_INTENSITIES
                            + np.arange(N_INTENSITIES)[None, :, None]
                            + np.zeros(per, dtype=np.int64)).reshape(-1)
        return index, domain

    # ------------------------------------------------------------------ API
    def check_inputs(self) -> None:
        """The outputs file, its shape, the set names (the data are read: one array)."""
        self._load()

    def split_sizes(self) -> dict[str, int]:
        return {name: int(rows.size) for name, rows in self._load()["index"].items()}

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        return int(self._load()["scores"].shape[1])

    def splits(self) -> list[str]:
        return list(self._load()["index"])

    def split(self, name: str) -> SplitData:
        loaded = self._load()
        if name not in loaded["index"]:
            raise KeyError(f"fd-shifts: no split {name!r}; available: "
                           f"{', '.join(loaded['index'])}")
        rows = loaded["index"][name]
        labels, k = loaded["labels"][rows], loaded["scores"].shape[1]
        outside = (labels < 0) | (labels >= k) | (np.mod(labels, 1) != 0)
        if outside.any():
            raise DataError(
                f"fd-shifts: {loaded['path']}: split {name!r} has labels outside the model's "
                f"{k} classes (e.g. {labels[outside][0]:g}): a new-class set, whose true class "
                "the model cannot predict; evaluate on another set")
        scores = loaded["scores"][rows]
        feats = None if loaded["features"] is None else loaded["features"][rows]
        meta = {"source": str(loaded["path"]), "set": name}
        try:
            if loaded["softmax"]:
                out = ModelOutputs.from_probabilities(scores.astype(np.float64), labels,
                                                      features=feats,
                                                      domain=loaded["domain"][rows], meta=meta)
            else:
                z = scores.astype(np.float64)
                p = np.exp(z - z.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                out = ModelOutputs(features=p if feats is None else feats, logits=scores,
                                   labels=labels, domain=loaded["domain"][rows], meta=meta)
        except DataError as exc:
            raise DataError(f"fd-shifts: {loaded['path']}: split {name!r}: {exc}") from exc
        return SplitData(inputs=out, labels=out.labels, domain=out.domain, meta=meta)


PLUGIN = Plugin(
    "fd-shifts",
    FDShifts,
    summary="one FD-Shifts experiment's test outputs (test_results/raw_logits.npz): "
    "val_tuning and every test set as splits",
)
