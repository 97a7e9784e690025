"""The training step captured in CUDA graphs (:class:`GraphedSteps`), for
:func:`selbench.training.engine.train_replicas` on a GPU (see its module docstring)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["GraphedSteps", "cuda_graphs_enabled"]


def cuda_graphs_enabled(device: Any, modules: Sequence[torch.nn.Module] = ()) -> bool:
    """Whether :func:`~selbench.training.engine.train_replicas` captures its training step in CUDA graphs: on a CUDA
    device, unless ``SELBENCH_CUDA_GRAPHS=0`` or a module (a stacked module, or any
    submodule) declares ``cuda_graphs = False``."""
    env = os.environ.get("SELBENCH_CUDA_GRAPHS", "").strip().lower()
    if env not in ("", "1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError(f"SELBENCH_CUDA_GRAPHS must be 1 or 0 (on or off), got {env!r}")
    if torch.device(device).type != "cuda" or env in ("0", "false", "no", "off"):
        return False
    return all(getattr(sub, "cuda_graphs", True) is not False
               for m in modules for sub in m.modules())


class GraphedSteps:
    """The training step captured in CUDA graphs, one per batch length (on a GPU a step of
    a few small replicas is bound by the host launching its ~60 kernels one by one; a graph
    replays them with one launch, and the same kernels on the same addresses compute the
    same numbers).

    Each batch length first runs :data:`WARMUP` eager steps (what allocates the optimiser's
    state and the libraries' workspaces before a capture), then is captured once and
    replayed: per step, the batch's rows are copied into a static index tensor and the
    input noise drawn into static tensors by the replicas' own generators, outside the
    graph, in the order the eager step draws them (so the draws are the eager ones). The
    optimiser must be the fused Adam (its ``capturable`` flag does not change its
    arithmetic). A capture that fails (a module that reads a value back to the host, say)
    falls back to the eager step for the rest of the training, with a warning.
    """

    WARMUP = 3

    def __init__(self, device: torch.device, optimizer, step, noise, noise_gens):
        self.device, self.optimizer, self.step = device, optimizer, step
        self.noise, self.noise_gens = list(noise), list(noise_gens)
        self.seen: dict[int, int] = {}
        self.graphs: dict[int, tuple[Any, torch.Tensor, torch.Tensor | None,
                                     list[torch.Tensor | None]]] = {}
        self.failed = False
        self._stream = torch.cuda.Stream(device=device)

    @classmethod
    def create(cls, device, modules, optimizer, step, noise, noise_gens):
        if not cuda_graphs_enabled(device, modules):
            return None
        if not all(group.get("fused") for group in optimizer.param_groups):
            return None  # the foreach Adam's capturable path computes differently
        for group in optimizer.param_groups:
            group["capturable"] = True
        return cls(torch.device(device), optimizer, step, noise, noise_gens)

    @contextmanager
    def stream(self) -> Iterator[None]:
        """Run the training on a side stream (captures need one); on leaving, the caller's
        stream waits for it and the graphs (and the gradients in their memory) are freed."""
        outer = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(outer)
        try:
            with torch.cuda.stream(self._stream):
                yield
        finally:
            outer.wait_stream(self._stream)
            self.optimizer.zero_grad(set_to_none=True)
            self.graphs.clear()

    def _draw_into(self, buffers: list[torch.Tensor | None], b: int) -> None:
        for (_, width), buf in zip(self.noise, buffers):
            if buf is not None:
                for u, gen in enumerate(self.noise_gens):
                    torch.randn((b, width), generator=gen, device=self.device, out=buf[u])

    def run(self, rows: torch.Tensor, lane_rows: torch.Tensor | None, b: int) -> bool:
        """One step through the graph of batch length ``b``; False when the caller must run
        it eagerly (a warm-up step, or captures failed)."""
        if self.failed:
            return False
        entry = self.graphs.get(b)
        if entry is None:
            self.seen[b] = self.seen.get(b, 0) + 1
            if self.seen[b] <= self.WARMUP:
                return False
            entry = self._capture(rows, lane_rows, b)
            if entry is None:
                return False
        graph, rows_buf, lane_buf, draw_bufs = entry
        rows_buf.view(rows.shape).copy_(rows)  # one strided copy from the epoch's order
        if lane_buf is not None:
            lane_buf.view(lane_rows.shape).copy_(lane_rows)
        self._draw_into(draw_bufs, b)
        graph.replay()
        return True

    def _capture(self, rows, lane_rows, b):
        rows_buf = rows.reshape(-1).clone()  # valid indices while capturing (nothing runs)
        lane_buf = None if lane_rows is None else lane_rows.reshape(-1).clone()
        draw_bufs: list[torch.Tensor | None] = [
            torch.empty((len(self.noise_gens), b, width), device=self.device)
            if self.noise_gens else None for _, width in self.noise
        ]
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        try:
            self._stream.synchronize()
            with torch.cuda.graph(graph, stream=self._stream):
                self.step(rows_buf, lane_buf, draw_bufs, b)
        except Exception as exc:  # any capture failure: the eager step, for the rest
            self.failed = True
            self.optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize(self.device)
            warnings.warn(
                f"training step could not be captured in a CUDA graph ({exc}); training "
                "eagerly (set cuda_graphs = False on the module to skip the attempt)",
                RuntimeWarning, stacklevel=3)
            return None
        entry = (graph, rows_buf, lane_buf, draw_bufs)
        self.graphs[b] = entry
        return entry
