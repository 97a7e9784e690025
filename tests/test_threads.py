"""Batched training's thread count (:func:`selbench.training.torchutils.batched_threads`):
chosen from what the machine can give (one thread when the CPU is oversubscribed, so that
torch's threads do not spin-wait for a core another process holds), and free to be chosen
so because the trained replicas are bit for bit the same on one thread or two."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from selbench.training import torchutils
from test_engine import CELLS, FAST, make_job, reg, synthetic


def _psi(tmp_path, some: float) -> str:
    path = tmp_path / "cpu"
    path.write_text(f"some avg10={some:.2f} avg60=1.00 avg300=0.50 total=123\n"
                    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    return str(path)


def test_cpu_pressure_reads_psi_some_avg10(tmp_path):
    assert torchutils.cpu_pressure(_psi(tmp_path, 37.5)) == 37.5
    assert torchutils.cpu_pressure(str(tmp_path / "absent")) is None
    bad = tmp_path / "bad"
    bad.write_text("some avg10=x\n")
    assert torchutils.cpu_pressure(str(bad)) is None
    bad.write_text("full avg10=50.00\n")  # no "some" line
    assert torchutils.cpu_pressure(str(bad)) is None


@pytest.mark.parametrize("pressure,expected", [(0.0, 4), (39.9, 4), (40.0, 1), (99.3, 1),
                                               (None, 4)])
def test_batched_threads_follow_the_machine(monkeypatch, pressure, expected):
    monkeypatch.delenv("SELBENCH_TRAIN_THREADS", raising=False)
    monkeypatch.setattr(torchutils, "cpu_pressure", lambda: pressure)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert torchutils.batched_threads("cpu") == expected
    # the environment switch wins over the machine's pressure
    monkeypatch.setenv("SELBENCH_TRAIN_THREADS", "3")
    assert torchutils.batched_threads("cpu") == 3


def _fit_on(threads: str, cells, monkeypatch) -> list:
    outs = {s: synthetic(seed=s) for s, _ in cells}
    monkeypatch.setenv("SELBENCH_TRAIN_THREADS", threads)
    jobs = [make_job(s, b, outs[s], rec="temperature", loss="s-mmce") for s, b in cells]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        reg("scheme", "joint", dict(FAST, noise_std=0.5)).fit_many(jobs)
    finally:
        torch.set_num_threads(before)
    return [(j.recalibrator.confidence(j.outputs),
             j.selector.score(j.outputs, j.recalibrator.confidence(j.outputs))) for j in jobs]


def _same(runs) -> bool:
    return all(np.array_equal(c1, c2) and np.array_equal(s1, s2) for (c1, s1), (c2, s2)
               in zip(*runs))


#: replicas whose stacked model (with the scheme's spare replica) has an even number of lanes
EVEN_LANES = ((0, 0.6), (1, 0.6), (2, 0.6))


@pytest.mark.parametrize("cells", [EVEN_LANES, CELLS], ids=["even-lanes", "odd-lanes"])
def test_batched_training_is_bitwise_the_same_on_one_or_two_threads(monkeypatch, cells):
    """The policy above may change the thread count from one batch to the next (and a pool's
    workers run with fewer threads than an inline run): the first layer's column blocks are
    cut for the machine's cores (layout_threads), not for the threads a batch runs with, so
    the trained replicas are the same bit for bit, whatever the parity of the lane count."""
    runs = [_fit_on(t, cells, monkeypatch) for t in ("1", "2")]
    assert _same(runs)


def test_the_layout_follows_the_machine_not_the_run(monkeypatch):
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.setenv("SELBENCH_TRAIN_THREADS", "1")
    monkeypatch.setattr(torchutils, "cpu_pressure", lambda: 99.0)
    assert torchutils.layout_threads() == cores
    # an odd lane count is cut in two column blocks for two cores, one for one
    assert torchutils.balanced_split(3, "cpu", 2) == 2
    assert torchutils.balanced_split(4, "cpu", 2) == 1
    assert torchutils.balanced_split(3, "cpu", 1) == 1
    assert torchutils.balanced_split(3, "meta", 2) == 1
