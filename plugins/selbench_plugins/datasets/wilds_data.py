"""``camelyon17`` and ``rxrx1``: the paper's WILDS datasets, read with the ``wilds`` package.

Both read the official WILDS v1.0 release from ``root_dir`` (the folder that holds
``camelyon17_v1.0/`` or ``rxrx1_v1.0/``) and expose the official splits under their WILDS
names, or under names of your choosing through ``splits`` (``{selbench name: WILDS name}``).

* **Camelyon17-WILDS** — 96×96 histopathology patches, tumour / no tumour, domain = the
  hospital (0–4). Splits: ``train`` (hospitals 0, 3, 4), ``id_val`` (same hospitals),
  ``val`` (hospital 1, 34,904 patches — the paper's fitting data, accuracy ≈ 91%) and
  ``test`` (hospital 2, 85,054 patches — the paper's evaluation data, accuracy ≈ 83%).
* **RxRx1-WILDS** — 256×256 3-channel fluorescence microscopy of cells, 1,139 siRNA
  treatments, domain = the experiment (imaging batch). Splits: ``train``, ``val`` (4
  experiments, 9,854 images — the paper's fitting data, accuracy ≈ 18%), ``test`` (14
  experiments, 34,432 images — evaluation, accuracy ≈ 27%) and ``id_test``.

Items are uint8 ``[3, H, W]`` tensors at the native resolution; the WILDS backbones apply
WILDS' own input normalisation on the device (the ``wilds-*`` backbones).
Nothing is downloaded unless ``download: true``; missing data is a ``FileNotFoundError``
saying where to get it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator
from selbench.contract.api import Dataset, Params, Plugin, SplitData
from selbench.contract.inputs import InputDir
from selbench.contract.vision import ImageItems, require

__all__ = ["PLUGINS", "Camelyon17", "RxRx1", "WildsImageDataset"]

VERSION = "1.0"


def _import_wilds(what: str) -> Any:
    """Import ``wilds`` without its import-time version check, which starts a thread that
    asks PyPI for the latest release (``requests.get`` without a timeout): offline, or
    behind a firewall that drops packets, it would keep the process from exiting."""
    if "wilds" in sys.modules:
        return require("wilds", what)
    saved = sys.modules.get("outdated", _ABSENT)
    sys.modules["outdated"] = None  # type: ignore[assignment]  # -> ImportError in wilds
    try:
        return require("wilds", what)
    finally:
        if saved is _ABSENT:
            del sys.modules["outdated"]
        else:
            sys.modules["outdated"] = saved


_ABSENT = object()


def _wilds_split_names(official: tuple[str, ...], scheme: str) -> tuple[str, ...]:
    return ("train", "val", "test") if scheme == "mixed-to-test" else official


def _known_splits(display: str, official: tuple[str, ...]) -> type[Params]:
    """Validators of a WILDS dataset: ``splits`` must map to its WILDS split names."""

    class _KnownSplits(Params):
        @model_validator(mode="after")
        def _known(self):
            names = _wilds_split_names(official, self.split_scheme)
            bad = sorted(set((self.splits or {}).values()) - set(names))
            if bad:
                raise ValueError(
                    f"splits: unknown {display} split(s) {bad}; WILDS names are "
                    f"{', '.join(names)}"
                )
            return self

    return _KnownSplits


class _WildsInput:
    """``get_image`` for one WILDS split (picklable for loader workers)."""

    def __init__(self, wilds_dataset: Any, indices: np.ndarray):
        self.dataset = wilds_dataset
        self.indices = indices

    def __call__(self, i: int):
        return self.dataset.get_input(int(self.indices[i]))


class WildsImageDataset(Dataset):
    """A WILDS image dataset read through the ``wilds`` package (base of the plugins)."""

    input_kind = "image-items"

    #: WILDS dataset name
    wilds_name: str = ""
    #: human-readable name used in messages
    display: str = ""
    #: approximate download size, for messages
    download_size: str = ""
    #: official split names (scheme 'official')
    official_splits: tuple[str, ...] = ()
    #: metadata field used as the domain
    domain_field: str = ""

    #: the ``splits`` parameter is kept as ``splits_map`` (``splits()`` lists the splits)
    param_attributes = {"splits": "splits_map"}

    def __init__(
        self,
        # metadata.csv holds the labels, splits and domains: hashed by content, like the
        # release marker; the images enter the digest by name and size. download: true may
        # create the folder.
        root_dir: Annotated[InputDir(metadata=("metadata.csv", "RELEASE_v*.txt"),
                                     must_exist=False), Field(
            description="folder holding the WILDS release folders (<dataset>_v1.0/)",
        )] = "data/wilds",
        download: Annotated[bool, Field(
            description="let the wilds package download the dataset into root_dir if it is "
            "missing (Camelyon17 ≈ 10.7 GB, RxRx1 ≈ 7.4 GB); off by default",
        )] = False,
        splits: Annotated[dict[str, str] | None, Field(
            description="{selbench split name: WILDS split name}; default: every official "
            "split under its WILDS name",
        )] = None,
        split_scheme: Annotated[Literal["official", "mixed-to-test"], Field(
            description="WILDS split scheme")] = "official",
    ):
        self.root_dir = root_dir
        self.download = download
        self.splits_map = splits
        self.split_scheme = split_scheme
        self._ds: Any = None
        self._cache: dict[str, SplitData] = {}


    # ------------------------------------------------------------------ names
    def _wilds_splits(self) -> tuple[str, ...]:
        return _wilds_split_names(self.official_splits, self.split_scheme)

    def splits(self) -> list[str]:
        if self.splits_map:
            return list(self.splits_map)
        return list(self._wilds_splits())

    @property
    def data_dir(self) -> Path:
        return Path(self.root_dir) / f"{self.wilds_name}_v{VERSION}"

    # ------------------------------------------------------------------ loading
    def _missing_message(self, missing: Path) -> str:
        return (
            f"{self.display} v{VERSION} not found: {missing} does not exist. selbench never "
            f"downloads data on its own. Get the dataset (about {self.download_size}) with\n"
            f"    python -c \"import wilds; wilds.get_dataset('{self.wilds_name}', "
            f"root_dir='{self.root_dir}', download=True)\"\n"
            f"or from https://wilds.stanford.edu/downloads (unpack it into "
            f"{self.data_dir}), or set the dataset's param download: true."
        )

    def wilds_dataset(self) -> Any:
        """The underlying ``wilds`` dataset object (built on first use)."""
        if self._ds is not None:
            return self._ds
        if not self.download:
            for need in (self.data_dir / "metadata.csv", self.data_dir / f"RELEASE_v{VERSION}.txt"):
                if not need.is_file():
                    raise FileNotFoundError(self._missing_message(need))
        get_dataset = _import_wilds(f"the {self.wilds_name} dataset").get_dataset
        self._ds = get_dataset(
            self.wilds_name,
            version=VERSION,
            root_dir=str(self.root_dir),
            download=self.download,
            split_scheme=self.split_scheme,
        )
        return self._ds

    def class_names(self) -> list[str] | None:
        return None

    def split(self, name: str) -> SplitData:
        if name in self._cache:
            return self._cache[name]
        available = self.splits()
        if name not in available:
            raise KeyError(f"{self.display}: no split {name!r}; available: {', '.join(available)}")
        wname = self.splits_map[name] if self.splits_map else name
        ds = self.wilds_dataset()
        split_array = np.asarray(ds.split_array)
        indices = np.flatnonzero(split_array == ds.split_dict[wname])
        labels = np.asarray(ds.y_array)[indices].astype(np.int64)
        fields = list(ds.metadata_fields)
        column = np.asarray(ds.metadata_array)[:, fields.index(self.domain_field)]
        domain = column[indices].astype(np.int64)
        meta: dict[str, Any] = {
            "dataset": self.wilds_name,
            "wilds_split": wname,
            "domain_field": self.domain_field,
        }
        names = (ds.metadata_map or {}).get(self.domain_field)
        if names is not None:
            meta["domains"] = [str(v) for v in names]
        else:
            meta["domains"] = [f"{self.domain_field} {i}" for i in range(int(column.max()) + 1)]
        items = ImageItems(_WildsInput(ds, indices), labels)
        data = SplitData(
            inputs=items, labels=labels, domain=domain, class_names=self.class_names(), meta=meta
        )
        self._cache[name] = data
        return data


class Camelyon17(WildsImageDataset):
    """Camelyon17-WILDS tumour detection (2 classes); domain = hospital. Reads the WILDS
    v1.0 release under ``root_dir``; the paper fits on ``val`` and evaluates on ``test``."""

    wilds_name = "camelyon17"
    display = "Camelyon17-WILDS"
    download_size = "10.7 GB"
    official_splits = ("train", "id_val", "val", "test")
    params_base = _known_splits(display, official_splits)
    domain_field = "hospital"
    num_classes = 2

    def class_names(self) -> list[str]:
        return ["normal lymph node tissue", "lymph node metastasis"]


class RxRx1(WildsImageDataset):
    """RxRx1-WILDS siRNA classification (1,139 classes); domain = experiment batch. Reads
    the WILDS v1.0 release under ``root_dir``; the paper fits on ``val``, evaluates on
    ``test``."""

    wilds_name = "rxrx1"
    display = "RxRx1-WILDS"
    download_size = "7.4 GB"
    official_splits = ("train", "val", "test", "id_test")
    params_base = _known_splits(display, official_splits)
    domain_field = "experiment"

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        if self._ds is None:
            return 1139
        return int(self._ds.n_classes)

    def class_names(self) -> list[str] | None:
        """The siRNA names, by ``sirna_id``, from ``metadata.csv``."""
        import pandas as pd

        df = pd.read_csv(self.data_dir / "metadata.csv", usecols=["sirna", "sirna_id"])
        df = df.drop_duplicates("sirna_id").sort_values("sirna_id")
        return [str(s) for s in df["sirna"]]


PLUGINS = [
    Plugin(
        "camelyon17",
        Camelyon17,
        summary="Camelyon17-WILDS histopathology patches (2 classes), domain = hospital; "
        "needs the wilds release on disk",
    ),
    Plugin(
        "rxrx1",
        RxRx1,
        summary="RxRx1-WILDS cell microscopy (1,139 siRNAs), domain = experiment batch; "
        "needs the wilds release on disk",
    ),
]
