"""``labelled-sentences``: sentences with class labels from text files, one domain per file;
by default the UCI "Sentiment Labelled Sentences" (yelp, amazon, imdb).

Each file holds one example per line, ``sentence<TAB>label`` (the UCI release's format; the
label is the class index, ``0`` negative and ``1`` positive there). The reader follows the
release's quirks:

* lines end in CRLF (a bare LF works too); empty lines are skipped;
* the label is what follows the **last** tab of the line (a sentence may hold a tab);
* a sentence that starts with ``"`` and ends with ``"`` is CSV-quoted (the release quotes
  every sentence containing a comma): the outer quotes are removed and inner doubled quotes
  ``""`` become ``"``; an unquoted sentence keeps any stray quote characters as they are;
* each line is decoded as UTF-8, falling back to Latin-1 (``imdb_labelled.txt`` has a few
  Latin-1 bytes, e.g. ``clichés``); leading and trailing spaces are removed.

Parameters: ``folder`` is the folder holding the files (users keep their own copy of the
release, https://archive.ics.uci.edu/dataset/331, CC BY 4.0); ``files`` maps each domain
name to its file in that folder (default: the three UCI domains), so any folder of
labelled sentences in this format can be read; ``class_names`` names the classes (their
number is K, every label must lie in ``[0, K)``).

Checksums: a file whose name is one of the UCI release's (``yelp_labelled.txt``,
``amazon_cells_labelled.txt``, ``imdb_labelled.txt``) must have that file's SHA-256, or the
error names the file and both checksums; ``verify: false`` reads an edited copy. Every
file's content enters the cache keys in any case (``folder`` is a declared input).

Splits: an experiment picks a ``source`` and a ``target`` domain.

* ``train``: the part (``fractions[0]``, default 50 %) of the source rows that a classifier
  head is trained on (the ``sentence-encoder`` backbone's ``linear`` head);
* ``val``: the other source rows, the fitting pool from which each seed draws its ``n_fit``
  rows (the source split is seeded by ``seed`` and stratified by class);
* ``shifted``: every row of the target domain, the evaluation split (the labels are read
  only by the metrics).

Every split's ``SplitData.inputs`` is a numpy array of ``str`` (the ``text`` input kind),
its ``domain`` the domain's index in ``files`` (``meta["domains"]`` names the indices) and
its ``meta`` names the split's ``domain``, ``file`` and that file's ``sha256``.
A missing file is a :class:`MissingSentencesFile` (a ``FileNotFoundError``) naming it;
``selbench validate`` reads the two files (``check_inputs``), so a missing or altered file
is one line and exit 2 before any run.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, Field, model_validator
from selbench.contract.api import Dataset, Params, Plugin, SplitData
from selbench.contract.data import DataError
from selbench.contract.inputs import InputDir

__all__ = [
    "PLUGIN",
    "UCI_FILES",
    "UCI_SHA256",
    "LabelledSentences",
    "MissingSentencesFile",
    "parse_line",
    "read_labelled_sentences",
]

#: the UCI release's domains and files (the defaults of ``files``)
UCI_FILES: dict[str, str] = {
    "yelp": "yelp_labelled.txt",
    "amazon": "amazon_cells_labelled.txt",
    "imdb": "imdb_labelled.txt",
}
#: SHA-256 of the UCI release's files, checked by name (``verify``)
UCI_SHA256: dict[str, str] = {
    "yelp_labelled.txt": "b1428e7e7452834f99401a1be3cc6abc778f92c1c8a12cad9adac2add9e714b3",
    "amazon_cells_labelled.txt":
        "16b1872aba98fb5f40e21ac76fc57615058010bba6c9388d101ec415995b638d",
    "imdb_labelled.txt": "a42450a6f0b2af9bd3738ca2a9af355678e90e5a0f8b83f849d60b59235faaa7",
}
UCI_URL = "https://archive.ics.uci.edu/dataset/331/sentiment+labelled+sentences"
SPLITS = ("train", "val", "shifted")

#: a folder of labelled-sentence files: every file enters the cache keys by content
SentencesDir = InputDir(metadata=("*",))


class MissingSentencesFile(DataError, FileNotFoundError):
    """A file of labelled sentences does not exist (a :class:`DataError`, and a
    ``FileNotFoundError``)."""


# --------------------------------------------------------------------------- reading
def parse_line(raw: bytes, where: str) -> tuple[str, int] | None:
    """``(sentence, label)`` of one line (``None`` for an empty line); ``where`` names the
    file and line in a :class:`DataError`."""
    raw = raw.rstrip(b"\r\n")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        line = raw.decode("latin-1")
    line = line.lstrip("\ufeff")
    if not line.strip():
        return None
    sentence, tab, label = line.rpartition("\t")
    if not tab:
        raise DataError(f"{where}: no tab; each line must be 'sentence<TAB>label'")
    try:
        value = int(label.strip())
    except ValueError:
        raise DataError(f"{where}: the label {label.strip()!r} after the last tab is not an "
                        "integer class index") from None
    if len(sentence) >= 2 and sentence[0] == sentence[-1] == '"':  # CSV-quoted
        sentence = sentence[1:-1].replace('""', '"')
    sentence = sentence.strip()
    if not sentence:
        raise DataError(f"{where}: the sentence before the tab is empty")
    return sentence, value


def read_labelled_sentences(path: str | Path, *, verify: bool = True
                            ) -> tuple[list[str], np.ndarray, str]:
    """The sentences, int64 labels and SHA-256 of a ``sentence<TAB>label`` file.

    With ``verify``, a file named like one of the UCI release's must have its checksum
    (:data:`UCI_SHA256`); a mismatch is a :class:`DataError` naming the file and both
    checksums. A missing file is a :class:`MissingSentencesFile`.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"labelled-sentences: {path} is a folder, expected a file of "
                        "'sentence<TAB>label' lines")
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        raise MissingSentencesFile(
            f"labelled-sentences: file {path} does not exist; point `folder` at your copy of "
            f"the files (the UCI Sentiment Labelled Sentences: {UCI_URL}) and `files` at "
            "their names") from None
    except OSError as exc:
        raise DataError(f"labelled-sentences: {path}: cannot read ({exc.strerror or exc})"
                        ) from exc
    digest = hashlib.sha256(blob).hexdigest()
    want = UCI_SHA256.get(path.name)
    if verify and want is not None and digest != want:
        raise DataError(
            f"labelled-sentences: {path} is not the UCI release's {path.name}: its sha256 is "
            f"{digest}, expected {want}; fetch the original ({UCI_URL}) or, for an edited "
            "copy, set verify: false")
    sentences, labels = [], []
    for i, raw in enumerate(blob.split(b"\n"), start=1):
        row = parse_line(raw, f"labelled-sentences: {path}, line {i}")
        if row is not None:
            sentences.append(row[0])
            labels.append(row[1])
    if not sentences:
        raise DataError(f"labelled-sentences: {path} holds no 'sentence<TAB>label' lines")
    return sentences, np.asarray(labels, dtype=np.int64), digest


# --------------------------------------------------------------------------- parameters
def _fractions(v: tuple[float, float]) -> tuple[float, float]:
    if any(f <= 0 for f in v) or abs(sum(v) - 1.0) > 1e-6:
        raise ValueError(f"fractions must be two positive numbers summing to 1, got {list(v)}")
    return v


def _files(v: dict[str, str]) -> dict[str, str]:
    if len(v) < 2:
        raise ValueError("files must name at least two domains (domain -> file name)")
    for domain, name in v.items():
        if not domain or not name:
            raise ValueError(f"files: empty domain or file name in {domain!r}: {name!r}")
    return v


def _class_names(v: list[str]) -> list[str]:
    if len(v) < 2 or len(set(v)) != len(v):
        raise ValueError(f"class_names must be at least two distinct names, got {v}")
    return v


class _Domains(Params):
    """``source`` and ``target`` are two different domains of ``files``."""

    @model_validator(mode="after")
    def _domains(self) -> Any:
        files = self.files
        for which in ("source", "target"):
            if getattr(self, which) not in files:
                raise ValueError(f"{which}: {getattr(self, which)!r} is not a domain of files; "
                                 f"domains: {', '.join(files)}")
        if self.source == self.target:
            raise ValueError(f"source and target are both {self.source!r}; the target domain "
                             "is the shifted evaluation split, so they must differ")
        return self


# --------------------------------------------------------------------------- dataset
class LabelledSentences(Dataset):
    """Labelled sentences, one domain per file (default: UCI yelp / amazon / imdb).

    Splits ``train`` and ``val`` (the source domain's rows, seeded and stratified) and
    ``shifted`` (the target domain's rows); inputs are numpy arrays of ``str``. See the
    module docstring for the file format, checksums and splits.
    """

    input_kind = "text"
    params_base = _Domains

    def __init__(
        self,
        folder: Annotated[SentencesDir, Field(
            description="folder holding the files (your copy of the UCI Sentiment Labelled "
            "Sentences, or any folder of 'sentence<TAB>label' files)")],
        files: Annotated[dict[str, str], AfterValidator(_files), Field(
            description="domain -> file name in folder (the domain ids follow this order)",
        )] = UCI_FILES,
        source: Annotated[str, Field(
            description="domain whose rows make the train and val splits")] = "yelp",
        target: Annotated[str, Field(
            description="domain whose rows make the shifted (evaluation) split")] = "amazon",
        fractions: Annotated[tuple[float, float], AfterValidator(_fractions), Field(
            description="fractions of the source rows in train / val (stratified, seeded)",
        )] = (0.5, 0.5),
        seed: Annotated[int, Field(ge=0, description="seed of the source split")] = 0,
        class_names: Annotated[list[str], AfterValidator(_class_names), Field(
            description="names of the classes 0..K-1 (K = their number)",
        )] = ["negative", "positive"],  # noqa: B006 - parameters are never mutated
        verify: Annotated[bool, Field(
            description="check the SHA-256 of files named like the UCI release's (false: "
            "an edited copy)")] = True,
    ):
        self.folder = folder
        self.files = files
        self.source = source
        self.target = target
        self.fractions = fractions
        self.seed = seed
        self.class_names = class_names
        self.verify = verify
        self._read: dict[str, tuple[np.ndarray, np.ndarray, str]] = {}
        self._index: dict[str, np.ndarray] | None = None

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        return len(self.class_names)

    def splits(self) -> list[str]:
        return list(SPLITS)

    # ------------------------------------------------------------------ reading
    def path(self, domain: str) -> Path:
        """The file of ``domain``."""
        return Path(self.folder) / self.files[domain]

    def domain_rows(self, domain: str) -> tuple[np.ndarray, np.ndarray, str]:
        """The sentences (array of str), labels and SHA-256 of ``domain``'s file (read once)."""
        if domain not in self._read:
            folder = Path(self.folder)
            if not folder.is_dir():
                raise MissingSentencesFile(
                    f"labelled-sentences: folder {folder} does not exist; point `folder` at "
                    f"your copy of the labelled sentences (UCI: {UCI_URL})")
            path = self.path(domain)
            sentences, labels, digest = read_labelled_sentences(path, verify=self.verify)
            bad = np.flatnonzero((labels < 0) | (labels >= self.num_classes))
            if bad.size:
                raise DataError(
                    f"labelled-sentences: {path}: label {int(labels[bad[0]])} of sentence "
                    f"{int(bad[0]) + 1} is outside 0..{self.num_classes - 1} (class_names "
                    f"{self.class_names})")
            self._read[domain] = (np.asarray(sentences, dtype=str), labels, digest)
        return self._read[domain]

    def _source_index(self) -> dict[str, np.ndarray]:
        """Row indices of ``train`` and ``val`` in the source file: per class a seeded
        permutation cut at ``fractions[0]``."""
        if self._index is None:
            labels = self.domain_rows(self.source)[1]
            rng = np.random.default_rng([self.seed, 0x5E47])
            train, val = [], []
            for k in range(self.num_classes):
                idx = rng.permutation(np.flatnonzero(labels == k))
                cut = int(round(self.fractions[0] * len(idx)))
                train.append(idx[:cut])
                val.append(idx[cut:])
            self._index = {"train": np.sort(np.concatenate(train)),
                           "val": np.sort(np.concatenate(val))}
        return self._index

    def check_inputs(self) -> None:
        """Read the source and target files: present, well formed, checksums right."""
        for domain in (self.source, self.target):
            self.domain_rows(domain)

    def split_sizes(self) -> dict[str, int]:
        index = self._source_index()
        return {"train": len(index["train"]), "val": len(index["val"]),
                "shifted": len(self.domain_rows(self.target)[1])}

    def split(self, name: str) -> SplitData:
        if name not in SPLITS:
            raise ValueError(f"labelled-sentences: unknown split {name!r}; available: "
                             f"{', '.join(SPLITS)}")
        domain = self.target if name == "shifted" else self.source
        sentences, labels, digest = self.domain_rows(domain)
        if name != "shifted":
            rows = self._source_index()[name]
            sentences, labels = sentences[rows], labels[rows]
        domains = list(self.files)
        return SplitData(
            inputs=sentences.copy(),
            labels=labels.copy(),
            domain=np.full(len(labels), domains.index(domain), dtype=np.int64),
            class_names=list(self.class_names),
            meta={"domains": domains, "domain": domain, "file": self.files[domain],
                  "sha256": digest, "split": name},
        )


PLUGIN = Plugin(
    "labelled-sentences",
    LabelledSentences,
    summary="labelled sentences, one domain per file (UCI yelp/amazon/imdb by default): "
    "source domain -> train/val, target domain -> shifted",
)
