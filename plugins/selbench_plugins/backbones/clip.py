"""``clip``: zero-shot classification with an open_clip model (the paper's CIFAR-100 setting).

For the class names of the split (:attr:`selbench.contract.api.SplitData.class_names`, underscores
read as spaces) the text tower embeds the prompts ``template.format(name)``; an image's
logits are ``logit_scale · cos(image embedding, class text embedding)`` (plus the model's
``logit_bias`` for SigLIP models), and its features are the L2-normalised image embedding.

Images arrive as the datasets' uint8 items and are prepared on the device as open_clip's
own preprocessing does: bicubic resize of the short side to the model's input size, centre
crop, the model's mean/std (for ``resize_mode: squash`` a direct resize instead).

Weights are **never downloaded**:

* a ``pretrained`` tag (``openai``, ``laion2b_s34b_b79k``, ...) is looked up in the local
  caches open_clip downloads to — the Hugging Face hub cache (``$HF_HOME``, ``cache_dir``) and
  ``~/.cache/clip`` — and a ``FileNotFoundError`` says how to fetch it if it is absent;
* ``pretrained_file`` loads that checkpoint file;
* ``pretrained: null`` keeps the random initialisation (seeded by ``init_seed``; tests and
  smoke runs);
* ``model_dir`` reads an open_clip model folder (``open_clip_config.json`` plus, optionally,
  its weights) and ignores ``model`` and ``pretrained``.

``pretrained_file``, ``model_dir`` and ``cache_dir`` are declared inputs: relative to the
spec's folder, and their content enters the cache keys. For older specs, a ``pretrained``
value that is not a tag (it has a ``/``, a ``.`` or a ``~``) is read as ``pretrained_file``,
and ``model: "local-dir:/path"`` as ``model_dir: /path``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from pathlib import Path
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from pydantic import AfterValidator, Field, model_validator
from selbench.contract.api import Backbone, Dataset, FitContext, Params, Plugin
from selbench.contract.data import ModelOutputs
from selbench.contract.inputs import InputDir, InputFile
from selbench.contract.vision import require

from .extract import (
    Amp,
    BatchSize,
    NumWorkers,
    extract_outputs,
    full_precision,
    normalize,
    to_float_images,
)
from .torchvision_nets import is_weights_name, name_or_file

__all__ = ["PLUGIN", "ClipZeroShot"]

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


LOCAL_DIR = "local-dir:"
#: what ``model`` reads when ``model_dir`` names the model
LOCAL_DIR_MODEL = "local-dir"

#: an open_clip model folder: its config, tokenizer files and weights are hashed by content
#: (weights of one architecture all have the same size, so name and size would not tell
#: two checkpoints apart)
ModelDir = InputDir(metadata=("*.json", "*.txt", "*.safetensors", "*.bin", "*.pt", "*.pth"))

#: an open_clip download cache: weights stored under their URL's file name (*.pt, *.pth) and
#: Hugging Face refs (which snapshot is current) are hashed by content; Hugging Face blobs
#: are named by their content hash already, so they enter by name and size
CacheDir = InputDir(metadata=("*.pt", "*.pth", "*/refs/*"))


class _ClipFiles(Params):
    """Which files hold the model: ``model_dir`` (a folder) replaces ``model`` and
    ``pretrained``; ``pretrained_file`` replaces ``pretrained``. Older specs' spellings move
    to those parameters: ``model: "local-dir:/path"`` to ``model_dir``, a path given as
    ``pretrained`` to ``pretrained_file``."""

    @model_validator(mode="before")
    @classmethod
    def _files(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        model = data.get("model")
        if isinstance(model, str) and model.startswith(LOCAL_DIR):  # older specs
            if data.get("model_dir") is not None:
                raise ValueError(
                    f"model {model!r} and model_dir both name a model folder; give it once, "
                    "as model_dir"
                )
            data = {**data, "model_dir": model[len(LOCAL_DIR):]}
        elif data.get("model_dir") is not None and model not in (None, LOCAL_DIR_MODEL):
            raise ValueError(f"give either model ({model!r}) or model_dir, not both")
        if data.get("model_dir") is not None:
            if data.get("pretrained_file") is not None:
                raise ValueError(
                    "model_dir holds the model's weights; pretrained_file cannot be used with it"
                )
            # the folder's own weights are used: pretrained does not apply
            data = {**data, "model": LOCAL_DIR_MODEL, "pretrained": None}
        return name_or_file(data, "pretrained", "pretrained_file")


def _one_placeholder(v: str) -> str:
    if v.count("{}") != 1:
        raise ValueError("template must contain exactly one {} for the class name")
    return v


def _cached_weights(cfg: dict, cache_dir: str | None) -> tuple[Path | None, list[str]]:
    """The local file of a pretrained tag, looking where open_clip downloads to."""
    looked: list[str] = []
    hub = cfg.get("hf_hub", "")
    if hub:
        hf = require("huggingface_hub", "looking up cached CLIP weights")
        repo, filename = os.path.split(hub)
        names = [filename] if filename else []
        names += ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        for name in dict.fromkeys(names):
            looked.append(f"hf://{repo}/{name}")
            found = hf.try_to_load_from_cache(repo, name, cache_dir=cache_dir)
            if isinstance(found, str) and os.path.isfile(found):
                return Path(found), looked
    url = cfg.get("url", "")
    if url:
        target = Path(cache_dir or os.path.expanduser("~/.cache/clip")) / os.path.basename(url)
        looked.append(str(target))
        if target.is_file():
            return target, looked
    return None, looked


class ClipZeroShot(Backbone):
    """Zero-shot open_clip classifier: logits = logit_scale × cosine(image, class prompts);
    features = normalised image embedding."""

    input_kinds = frozenset({"image-items"})
    #: an inference pass, row by row: a distributed run may extract a large split in shards
    shardable = True
    params_base = _ClipFiles

    def __init__(
        self,
        model: Annotated[str, Field(
            description="open_clip model name (e.g. ViT-B-32); ignored with model_dir",
        )] = "ViT-B-32",
        model_dir: Annotated[ModelDir | None, Field(
            description="an open_clip model folder (open_clip_config.json + weights)",
        )] = None,
        pretrained: Annotated[str | None, Field(
            description="weights tag (from the local cache, never downloaded), or null for "
            "random init (unless pretrained_file is given)",
        )] = "openai",
        pretrained_file: Annotated[InputFile | None, Field(
            description="a checkpoint file to load instead of a tagged download",
        )] = None,
        template: Annotated[str, AfterValidator(_one_placeholder), Field(
            description="prompt; {} is the class name",
        )] = "a photo of a {}.",
        cache_dir: Annotated[CacheDir | None, Field(
            description="open_clip cache_dir the weights were downloaded to (default: HF "
            "cache)",
        )] = None,
        init_seed: Annotated[int, Field(
            ge=0, description="seed of the random init (pretrained: null)")] = 0,
        batch_size: BatchSize = 256,
        num_workers: NumWorkers = 4,
        amp: Amp = True,
    ):
        self.model = model
        self.model_dir = model_dir
        self.pretrained = pretrained
        self.pretrained_file = pretrained_file
        self.template = template
        self.cache_dir = cache_dir
        self.init_seed = init_seed
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.amp = amp
        self._net: Any = None
        self._text: dict[tuple[str, ...], torch.Tensor] = {}

    def _source(self) -> tuple[str, str | None, str | None]:
        """``(open_clip model name, pretrained tag, checkpoint file)``: the name is
        ``local-dir:<model_dir>`` for a model folder; a ``local-dir:`` model or a path given
        as ``pretrained`` (Python callers of older versions) is read as such."""
        model, model_dir = self.model, self.model_dir
        pretrained, pretrained_file = self.pretrained, self.pretrained_file
        if model_dir is None and model.startswith(LOCAL_DIR):
            model_dir = model[len(LOCAL_DIR):]
        if model_dir is None and model == LOCAL_DIR_MODEL:
            raise ValueError(f"clip: model {LOCAL_DIR_MODEL!r} needs model_dir (the folder)")
        if pretrained_file is None and pretrained is not None and not is_weights_name(pretrained):
            pretrained, pretrained_file = None, pretrained
        name = f"{LOCAL_DIR}{model_dir}" if model_dir is not None else model
        return name, (None if pretrained_file is not None else pretrained), pretrained_file

    # ------------------------------------------------------------------ model
    def build(self) -> Any:
        """The open_clip model, weights loaded from local files only."""
        if self._net is not None:
            return self._net
        oc = require("open_clip", "the clip backbone")
        name, tag, pretrained_file = self._source()
        if name.startswith("hf-hub:"):
            raise ValueError(
                f"clip: model {name!r} would be fetched from the Hugging Face hub; selbench "
                "never downloads. Download the repository once and give its folder as model_dir "
                "(open_clip's local-dir: model)"
            )
        kwargs: dict[str, Any] = {}
        if name.startswith(LOCAL_DIR):
            tag = None  # the folder's own weights, if any
        elif pretrained_file is not None:
            path = Path(pretrained_file).expanduser()  # absolute when built from a spec
            if not path.is_file():
                raise FileNotFoundError(f"clip: checkpoint file {path} does not exist")
            tag = str(path)
        elif tag is None:
            pass
        else:
            cfg = oc.get_pretrained_cfg(name, tag)
            if not cfg:
                tags = oc.list_pretrained_tags_by_model(name)
                raise ValueError(
                    f"clip: {tag!r} is not a pretrained tag of {name!r} (tags: "
                    f"{', '.join(tags) or 'none'}); give a checkpoint file as pretrained_file"
                )
            path, looked = _cached_weights(cfg, self.cache_dir)
            if path is None:
                raise FileNotFoundError(
                    f"clip: weights {name}/{tag} are not in the local cache (looked for "
                    f"{'; '.join(looked)}). selbench never downloads weights. Fetch them once "
                    "where there is internet access with\n"
                    f"    python -c \"import open_clip; open_clip.create_model('{name}', "
                    f"pretrained='{tag}')\"\n"
                    "(they go to the Hugging Face cache, ~/.cache/huggingface/hub; copy that "
                    "folder over or set HF_HOME), or give the checkpoint file as pretrained_file."
                )
            tag = str(path)
            kwargs["force_quick_gelu"] = bool(cfg.get("quick_gelu", False))
            pre = {k: cfg[k] for k in ("mean", "std", "interpolation", "resize_mode") if k in cfg}
            if pre:
                kwargs["force_preprocess_cfg"] = pre
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.init_seed)
            if "weights_only" in inspect.signature(oc.create_model).parameters:
                kwargs["weights_only"] = True  # never unpickle arbitrary objects
            net = oc.create_model(name, pretrained=tag, device="cpu", **kwargs)
        net.eval()
        self._net = net
        return net

    def _preprocess_cfg(self, net: Any) -> tuple[int, tuple, tuple, str]:
        cfg = dict(getattr(net.visual, "preprocess_cfg", {}) or {})
        size = getattr(net.visual, "image_size", cfg.get("size", 224))
        if isinstance(size, (tuple, list)):
            if size[0] != size[1]:
                raise ValueError(f"clip: non-square input size {size} is not supported")
            size = size[0]
        mode = cfg.get("resize_mode", "shortest")
        if mode not in ("shortest", "squash"):
            raise ValueError(f"clip: resize_mode {mode!r} is not supported (shortest, squash)")
        mean, std = tuple(cfg.get("mean", OPENAI_MEAN)), tuple(cfg.get("std", OPENAI_STD))
        return int(size), mean, std, mode

    def text_embeddings(self, class_names: list[str], device: torch.device) -> torch.Tensor:
        """L2-normalised text embeddings ``[K, D]`` of the class prompts (cached)."""
        key = tuple(class_names)
        if key not in self._text:
            oc = require("open_clip", "the clip backbone")
            net = self.build().to(device)
            tokenizer = oc.get_tokenizer(self._source()[0])
            prompts = [self.template.format(c.replace("_", " ")) for c in class_names]
            chunks = []
            cuda = device.type == "cuda"
            ctx = (
                torch.autocast("cuda", dtype=torch.float16)
                if cuda and self.amp
                else contextlib.nullcontext()
            )
            with torch.inference_mode(), ctx:
                for i in range(0, len(prompts), 256):
                    tokens = tokenizer(prompts[i:i + 256]).to(device)
                    chunks.append(net.encode_text(tokens).float())
            # the class embeddings are normalised in float32 (outside autocast)
            self._text[key] = F.normalize(torch.cat(chunks), dim=-1)
        return self._text[key].to(device)

    # ------------------------------------------------------------------ extraction
    def extract(self, dataset: Dataset, split: str, context: FitContext) -> ModelOutputs:
        data = dataset.split(split)
        if not data.class_names:
            raise ValueError(
                f"clip: split {split!r} of {type(dataset).__name__} has no class names; "
                "zero-shot classification needs SplitData.class_names"
            )
        k = int(getattr(dataset, "num_classes", len(data.class_names)))
        if len(data.class_names) != k:
            raise ValueError(
                f"clip: split {split!r} has {len(data.class_names)} class names for {k} classes"
            )
        device = torch.device(context.device)
        net = self.build().to(device)
        text = self.text_embeddings(list(data.class_names), device)
        size, mean, std, mode = self._preprocess_cfg(net)
        scale = net.logit_scale.detach().float().exp().clamp(max=100.0)
        bias = getattr(net, "logit_bias", None)
        bias = None if bias is None else bias.detach().float()

        def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = to_float_images(x)
            x = _resize_crop(x, size, mode).clamp_(0.0, 1.0)
            emb = net.encode_image(normalize(x, mean, std)).float()
            with full_precision(emb):
                img = F.normalize(emb, dim=-1)
                logits = scale * img @ text.T
                if bias is not None:
                    logits = logits + bias
            return img, logits

        return extract_outputs(
            dataset, split, context, step,
            batch_size=self.batch_size, num_workers=self.num_workers, amp=self.amp,
            name="clip",
            meta={"model": self._source()[0],
                  "pretrained": self._source()[2] or self._source()[1],
                  "template": self.template, "logit_scale": float(scale)},
        )  # fmt: skip


def _resize_crop(x: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """open_clip's eval geometry on a float batch: bicubic resize (short side, or both sides
    for ``squash``) to ``size``, then a centre crop."""
    h, w = x.shape[-2:]
    if mode == "squash":
        if (h, w) != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bicubic", align_corners=False,
                              antialias=True)
        return x
    if min(h, w) != size:
        scale = size / min(h, w)
        nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
        x = F.interpolate(x, size=(nh, nw), mode="bicubic", align_corners=False, antialias=True)
        h, w = nh, nw
    top, left = (h - size) // 2, (w - size) // 2
    return x[..., top:top + size, left:left + size]


PLUGIN = Plugin(
    "clip",
    ClipZeroShot,
    summary="open_clip zero-shot classifier (weights from the local cache only); "
    "features = normalised image embedding",
)
