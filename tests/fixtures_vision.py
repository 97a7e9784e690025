"""Tiny datasets written in the *real* on-disk formats of the paper's data, for the tests.

Each ``make_*`` function writes, under a folder it is given, a few seeded random images in
exactly the layout the real release uses, so that the dataset plugins read them through the
same code paths (the ``wilds`` package, torchvision's ImageFolder, the CIFAR pickles, the
CIFAR-100-C ``.npy`` files). Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

_EXTRA = "pip install 'selbench[vision]'"
#: the vision extra's packages, looked up without importing them (importing wilds starts
#: its PyPI version check: see datasets/wilds_data.py)
HAS = {name: importlib.util.find_spec(name) is not None
       for name in ("torchvision", "wilds", "open_clip")}
#: skip markers of the tests that need a package of the vision extra; the others (lazy
#: imports, declared inputs, spec validation, the CIFAR readers ...) run without it
needs_torchvision = pytest.mark.skipif(not HAS["torchvision"],
                                       reason=f"needs torchvision (the vision extra: {_EXTRA})")
needs_wilds = pytest.mark.skipif(not HAS["wilds"], reason=f"needs wilds (the vision extra: {_EXTRA})")
needs_open_clip = pytest.mark.skipif(not HAS["open_clip"],
                                     reason=f"needs open_clip (the vision extra: {_EXTRA})")

CIFAR100_C_CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
    "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
    "elastic_transform", "pixelate", "jpeg_compression",
)  # fmt: skip


def _png(path: Path, rng: np.random.Generator, h: int, w: int) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(path)


def make_camelyon17(root: Path, counts=(6, 4, 5, 7), size: int = 96, seed: int = 0) -> Path:
    """``root/camelyon17_v1.0/`` with ``metadata.csv``, ``RELEASE_v1.0.txt`` and
    ``patches/patient_XXX_node_N/patch_patient_XXX_node_N_x_X_y_Y.png``.

    ``counts`` = patches in (train, id_val, val, test): train/id_val come from hospitals
    0, 3, 4; val from hospital 1 and test from hospital 2, as in WILDS.
    """
    import pandas as pd

    rng = np.random.default_rng(seed)
    data_dir = Path(root) / "camelyon17_v1.0"
    rows = []
    plan = [(0, (0, 3, 4)), (1, (0, 3, 4)), (None, (1,)), (None, (2,))]
    for (split_col, centers), count in zip(plan, counts):
        for i in range(count):
            center = centers[i % len(centers)]
            patient = 10 * center + i % 2
            node = i % 3
            rows.append({
                "patient": f"{patient:03d}", "node": node,
                "x_coord": int(rng.integers(0, 50000)), "y_coord": int(rng.integers(0, 50000)),
                "tumor": int(i % 2), "slide": 10 * center + node, "center": center,
                "split": 0 if split_col is None else split_col,
            })  # fmt: skip
    df = pd.DataFrame(rows)
    df = df.drop_duplicates(["patient", "node", "x_coord", "y_coord"]).reset_index(drop=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(data_dir / "metadata.csv")
    (data_dir / "RELEASE_v1.0.txt").write_text("fixture\n")
    for r in df.itertuples():
        p, n = r.patient, r.node
        _png(
            data_dir / "patches" / f"patient_{p}_node_{n}"
            / f"patch_patient_{p}_node_{n}_x_{r.x_coord}_y_{r.y_coord}.png",
            rng, size, size,
        )
    return data_dir


def make_rxrx1(root: Path, n_classes: int = 4, size: int = 32, seed: int = 0) -> Path:
    """``root/rxrx1_v1.0/`` with ``metadata.csv``, ``RELEASE_v1.0.txt`` and
    ``images/<experiment>/Plate<p>/<well>_s<site>.png``.

    Experiments: train HEPG2-01, HUVEC-01 (site 1 = train, site 2 = id_test); val HEPG2-08;
    test HUVEC-17 and RPE-05. Every siRNA id ``0..n_classes-1`` occurs in each experiment.
    """
    import pandas as pd

    rng = np.random.default_rng(seed)
    data_dir = Path(root) / "rxrx1_v1.0"
    experiments = {
        "HEPG2-01": ("train", (1, 2)), "HUVEC-01": ("train", (1, 2)),
        "HEPG2-08": ("val", (1, 2)), "HUVEC-17": ("test", (1, 2)), "RPE-05": ("test", (1,)),
    }  # fmt: skip
    rows = []
    for exp, (dataset, sites) in experiments.items():
        for c in range(n_classes):
            well = f"B{c + 2:02d}"
            for site in sites:
                rows.append({
                    "site_id": f"{exp}_1_{well}_{site}", "well_id": f"{exp}_1_{well}",
                    "cell_type": exp.split("-")[0], "dataset": dataset, "experiment": exp,
                    "plate": 1, "well": well, "site": site, "sirna": f"s{1000 + c}",
                    "sirna_id": c,
                })  # fmt: skip
    df = pd.DataFrame(rows)
    data_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(data_dir / "metadata.csv", index=False)
    (data_dir / "RELEASE_v1.0.txt").write_text("fixture\n")
    for r in df.itertuples():
        _png(data_dir / "images" / r.experiment / f"Plate{r.plate}" / f"{r.well}_s{r.site}.png",
             rng, size, size)
    return data_dir


def make_imagefolder(root: Path, classes=("n01440764", "n01443537", "n01484850"),
                     per_class: int = 2, seed: int = 0) -> Path:
    """ILSVRC2012 validation images sorted into one folder per class (ImageFolder layout),
    with varied image sizes so the resize / centre-crop path is exercised."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    k = 0
    for c in classes:
        for _ in range(per_class):
            k += 1
            h, w = int(rng.integers(40, 80)), int(rng.integers(40, 80))
            from PIL import Image

            (root / c).mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(
                root / c / f"ILSVRC2012_val_{k:08d}.JPEG", format="JPEG"
            )
    return root


def make_cifar100(root: Path, n_train: int = 12, n_test: int = 8, seed: int = 0) -> Path:
    """``root/cifar-100-python/{train,test,meta}`` pickles as in the official release."""
    rng = np.random.default_rng(seed)
    d = Path(root) / "cifar-100-python"
    d.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("test", n_test)):
        fine = rng.integers(0, 100, size=n)
        with open(d / name, "wb") as fh:
            pickle.dump(
                {
                    "filenames": [f"img_{i}.png" for i in range(n)],
                    "batch_label": f"{name} batch",
                    "fine_labels": [int(v) for v in fine],
                    "coarse_labels": [int(v) // 5 for v in fine],
                    "data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                },
                fh,
                protocol=2,
            )
    with open(d / "meta", "wb") as fh:
        pickle.dump(
            {"fine_label_names": [f"class_{i}" for i in range(100)],
             "coarse_label_names": [f"super_{i}" for i in range(20)]},
            fh,
            protocol=2,
        )
    return d


def make_cifar100_c(root: Path, per_severity: int = 6, corruptions=CIFAR100_C_CORRUPTIONS,
                    seed: int = 0) -> Path:
    """``root/<corruption>.npy`` uint8 ``[5·m, 32, 32, 3]`` (severities 1..5 stacked, m
    images each) and ``root/labels.npy`` int ``[5·m]``, as in the CIFAR-100-C release."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    labels = rng.integers(0, 100, size=per_severity)
    np.save(root / "labels.npy", np.tile(labels, 5).astype(np.int64))
    for c in corruptions:
        np.save(root / f"{c}.npy",
                rng.integers(0, 256, size=(5 * per_severity, 32, 32, 3), dtype=np.uint8))
    return root


def make_tiny_clip(root: Path) -> str:
    """An open_clip ``local-dir:`` model folder with a tiny config and no weights (random
    init); returns the model name to pass to the ``clip`` backbone."""
    d = Path(root) / "tiny-clip"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model_cfg": {
            "embed_dim": 16,
            "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16,
                           "patch_size": 16},
            "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2,
                         "layers": 1},
        },
        "preprocess_cfg": {},
    }
    (d / "open_clip_config.json").write_text(json.dumps(cfg))
    return f"local-dir:{d}"
