"""``calarena``: one (dataset, model) experiment of CalArena's published model outputs.

CalArena (Berta, Holzmüller, Bach & Jordan, *CalArena: a large-scale post-hoc calibration
benchmark*, 2026; https://github.com/probkit/CalArena) ranks calibrators over hundreds of
(dataset, model) pairs from the held-out predictions of tabular and vision models, and
publishes them (about 1.7 GB, https://huggingface.co/datasets/probkit/CalArena). This plugin
reads that format as CalArena's own ``run_benchmark.py`` does, so that every one of those
experiments becomes a selective-recalibration experiment.

The format (read from ``run_benchmark.py`` and ``calibration_benchmarks/generate_*_benchmarks.py``
of probkit/CalArena): a folder (CalArena's ``calibration_benchmarks/``) holding, per benchmark
``{name}-{binary|multiclass}`` (``tabrepo-binary``, ``tabarena-binary``, ``cv-binary``,
``tabrepo-multiclass``, ``tabarena-multiclass``, ``cv-multiclass``, ``imagenet-multiclass``):

* ``{benchmark}.h5``: an HDF5 file with one group ``{dataset}/{model}`` per experiment, each
  holding ``probas_cal``, ``labels_cal``, ``probas_test``, ``labels_test`` (probabilities
  float32: ``[n, K]`` for multiclass, ``[n]`` positive-class probabilities for binary;
  labels int32 ``[n]``); the file's attributes ``source`` and ``problem_type``;
* ``{benchmark}-experiments.csv``: the index, columns ``dataset``, ``model``, ``cal_size``,
  ``test_size`` (and ``n_classes`` for multiclass, more for TabRepo).

Splits: ``cal`` (CalArena's calibration part: the fitting split; set the experiment's
``n_fit`` below its size so that every seed draws its own fitting rows) and ``test``
(CalArena's test part: the evaluation split). A binary experiment's probability ``p`` becomes
the two classes ``[1 - p, p]``, as CalArena's uncalibrated baseline does; logits are
``log p`` and the selector's features the probability vector (there is no embedding).
There is no distribution shift between the parts (both are held-out rows of one dataset).

Reading HDF5 needs ``h5py`` (``pip install h5py``, or the ``calarena`` extra:
``pip install selbench[calarena]``); without it, or without the file, the
group or an array, ``selbench validate`` / ``run`` say so in one line naming it (exit 2).

What a user with internet does::

    # the data (1.7 GB): every {benchmark}.h5 and {benchmark}-experiments.csv
    huggingface-cli download probkit/CalArena --repo-type dataset --local-dir calarena
    pip install "selbench[calarena]"   # h5py
    # one experiment per row of the index, with the methods and settings of an existing spec
    python -m selbench_plugins.datasets.calarena_spec calarena cv-multiclass \\
        --like specs/arena.yaml --out calarena-cv.yaml
    selbench run calarena-cv.yaml

The generated spec is the ``--like`` spec with its experiments replaced by one per
(dataset, model) of the benchmark (``--limit`` takes the first rows), each::

    dataset: {name: calarena, params: {folder: calarena, benchmark: cv-multiclass,
                                       dataset: c100, model: densenet40}}
    backbone: {name: precomputed}
    fit_split: cal
    eval_split: test
    n_fit: <80 % of cal_size, at most the template's n_fit>
"""

from __future__ import annotations

import csv
import difflib
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field
from selbench.contract.api import Dataset, Plugin, SplitData
from selbench.contract.data import DataError, ModelOutputs
from selbench.contract.inputs import InputDir

__all__ = ["ARRAYS", "PLUGIN", "CalArena", "MissingCalArenaData", "experiments"]

#: the arrays of every ``{dataset}/{model}`` group, as CalArena writes them
ARRAYS: tuple[str, ...] = ("probas_cal", "labels_cal", "probas_test", "labels_test")
#: selbench split -> (probabilities, labels) arrays of the group
SPLITS: dict[str, tuple[str, str]] = {"cal": ("probas_cal", "labels_cal"),
                                      "test": ("probas_test", "labels_test")}


class MissingCalArenaData(DataError, FileNotFoundError):
    """The benchmark's file is absent (a :class:`DataError`, and a ``FileNotFoundError``)."""


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as exc:
        raise DataError("calarena: reading CalArena's .h5 files needs the h5py package; "
                        "install it with `pip install h5py`") from exc
    return h5py


class CalArena(Dataset):
    """The ``cal`` / ``test`` parts of one CalArena (dataset, model) experiment, as
    :class:`ModelOutputs` (log-probabilities as logits, probabilities as features)."""

    input_kind = "model-outputs"

    def __init__(
        self,
        folder: Annotated[InputDir(metadata=("*-experiments.csv",)), Field(
            description="CalArena's calibration_benchmarks folder: {benchmark}.h5 and "
            "{benchmark}-experiments.csv",
        )],
        benchmark: Annotated[str, Field(
            pattern=r"^[A-Za-z0-9_.]+(-[A-Za-z0-9_.]+)*-(binary|multiclass)$",
            description="benchmark name, {source}-{binary|multiclass}, e.g. cv-multiclass",
        )],
        dataset: Annotated[str, Field(min_length=1, description="the experiment's dataset "
                                      "(first column of the experiments index)")],
        model: Annotated[str, Field(min_length=1, description="the experiment's model "
                                    "(second column of the experiments index)")],
    ):
        self.folder = folder
        self.benchmark = benchmark
        self.dataset = dataset
        self.model = model
        self._loaded: dict[str, ModelOutputs] | None = None

    # ------------------------------------------------------------------ reading
    @property
    def file(self) -> Path:
        return Path(self.folder) / f"{self.benchmark}.h5"

    def _group(self, h5: Any) -> Any:
        """The experiment's group, every array present, else a one-line DataError."""
        key = f"{self.dataset}/{self.model}"
        if self.dataset not in h5 or key not in h5:
            if self.dataset in h5:
                what, wanted, names = "model", self.model, sorted(h5[self.dataset].keys())
            else:
                what, wanted, names = "dataset", self.dataset, sorted(h5.keys())
            close = difflib.get_close_matches(wanted, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            shown = ", ".join(names[:8]) + (f" ... ({len(names)} in all)" if len(names) > 8 else "")
            raise DataError(f"calarena: {self.file}: no group {key!r} (no {what} {wanted!r}; "
                            f"it holds {shown}){hint}")
        group = h5[key]
        missing = [a for a in ARRAYS if a not in group]
        if missing:
            raise DataError(f"calarena: {self.file}: group {key!r} has no array "
                            f"{missing[0]!r}; it holds {', '.join(sorted(group.keys()))}")
        return group

    def _open(self) -> Any:
        if not self.file.is_file():
            index = Path(self.folder) / f"{self.benchmark}-experiments.csv"
            raise MissingCalArenaData(
                f"calarena: {self.file} does not exist (benchmark {self.benchmark!r}"
                + ("" if index.is_file() else f", nor its index {index.name}")
                + "); download the benchmark files of probkit/CalArena into the folder")
        h5py = _h5py()
        try:
            return h5py.File(self.file, "r")
        except OSError as exc:
            raise DataError(f"calarena: {self.file} is not a readable HDF5 file ({exc})") from exc

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        with self._open() as h5:
            group = self._group(h5)
            shapes = {a: tuple(group[a].shape) for a in ARRAYS}
        for probas, labels in SPLITS.values():
            p, y = shapes[probas], shapes[labels]
            if len(p) not in (1, 2) or len(y) != 1 or p[0] != y[0]:
                raise DataError(
                    f"calarena: {self.file}: {self.dataset}/{self.model}: {probas!r} has shape "
                    f"{p} and {labels!r} {y}; expected [n] or [n, K] probabilities and [n] "
                    "labels for the same n rows")
        return shapes

    def _load(self) -> dict[str, ModelOutputs]:
        if self._loaded is not None:
            return self._loaded
        self._shapes()
        with self._open() as h5:
            group = self._group(h5)
            raw = {a: np.asarray(group[a][()]) for a in ARRAYS}
        loaded = {}
        for split, (probas, labels) in SPLITS.items():
            p = raw[probas].astype(np.float64)
            if p.ndim == 1 or p.shape[1] == 1:  # binary: positive-class probabilities
                p = p.reshape(-1)
                p = np.stack([1.0 - p, p], axis=1)
            meta = {"source": str(self.file), "benchmark": self.benchmark,
                    "dataset": self.dataset, "model": self.model, "part": split}
            try:
                loaded[split] = ModelOutputs.from_probabilities(p, raw[labels], meta=meta)
            except DataError as exc:
                raise DataError(f"calarena: {self.file}: {self.dataset}/{self.model}: arrays "
                                f"{probas!r} / {labels!r}: {exc}") from exc
        self._loaded = loaded
        return loaded

    # ------------------------------------------------------------------ API
    def check_inputs(self) -> None:
        """The file, the group and its four arrays, with consistent shapes (not read)."""
        self._shapes()

    def split_sizes(self) -> dict[str, int]:
        shapes = self._shapes()
        return {split: shapes[labels][0] for split, (_, labels) in SPLITS.items()}

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        return self._load()["cal"].num_classes

    def splits(self) -> list[str]:
        return list(SPLITS)

    def split(self, name: str) -> SplitData:
        if name not in SPLITS:
            raise KeyError(f"calarena: no split {name!r}; available: {', '.join(SPLITS)}")
        out = self._load()[name]
        return SplitData(inputs=out, labels=out.labels, domain=None,
                         meta={"source": str(self.file), "split": name})


# ---------------------------------------------------------------------------- the index
def experiments(folder: str | Path, benchmark: str) -> list[dict[str, Any]]:
    """The rows of ``{benchmark}-experiments.csv`` (``dataset``, ``model``, ``cal_size``,
    ``test_size``, ...), sizes as integers; a :class:`MissingCalArenaData` when absent."""
    index = Path(folder) / f"{benchmark}-experiments.csv"
    if not index.is_file():
        raise MissingCalArenaData(f"calarena: {index} does not exist; download the benchmark "
                                  "files of probkit/CalArena into the folder")
    with open(index, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    need = {"dataset", "model", "cal_size", "test_size"}
    if not rows or not need <= set(rows[0]):
        raise DataError(f"calarena: {index}: expected the columns {', '.join(sorted(need))}, "
                        f"found {', '.join(rows[0]) if rows else 'no rows'}")
    for row in rows:
        for col in ("cal_size", "test_size"):
            row[col] = int(row[col])
    return rows


PLUGIN = Plugin(
    "calarena",
    CalArena,
    summary="one (dataset, model) experiment of CalArena's published model outputs "
    "({benchmark}.h5: cal / test parts)",
)
