"""What ``bench_peers.py`` and its sections (``peers_smooth.py``, ``peers_riskcov.py``)
share: the timing rule (best of repeats, one call when slow), the import of an optional peer
(reported and skipped when missing), the seeded synthetic data, and the rows, ratio tables and
failed value checks of a run (:class:`Report`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from common import best_of, target

#: a call slower than this (seconds) is timed once
SLOW = 1.0


def timeit(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Best wall time of ``repeats`` calls (one call when the first takes over SLOW s)."""
    t, value = best_of(fn, 1)
    if t < SLOW and repeats > 1:
        t2, value = best_of(fn, repeats - 1)
        t = min(t, t2)
    return t, value


def peer(name: str) -> Any:
    """The peer's top-level module, or None (reported) when it is not installed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return __import__(name)
    except ImportError as exc:
        print(f"  ({name} not installed: {exc}; pip install -e '.[perf]')")
        return None


# ------------------------------------------------------------------------------ data
def make_data(n: int, k: int, scale: float = 2.0, temperature: float = 2.0, seed: int = 0):
    """Float32 logits ``scale * N(0, 1)`` and labels drawn from softmax(z / temperature)."""
    rng = np.random.default_rng([seed, n, k])
    z = (rng.normal(size=(n, k)) * scale).astype(np.float32)
    s = z.astype(np.float64) / temperature
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    labels = (p.cumsum(1) < rng.random((n, 1))).sum(1).clip(0, k - 1)
    return z, labels.astype(np.int64)


def softmax64(z: np.ndarray) -> np.ndarray:
    """Float64 probabilities, as ``ModelOutputs.probabilities``."""
    z = z.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def top(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-label confidence and int64 correctness, as the peers' users would compute them."""
    return probs.max(1), (probs.argmax(1) == labels).astype(np.int64)


# ------------------------------------------------------------------------------ rows
@dataclass
class Row:
    name: str
    seconds: float
    check: str = ""
    ok: bool | None = None  # None: values not compared
    same_definition: bool = True
    prep: float = 0.0  # seconds to make this row's inputs from the logits


class Report:
    """Rows of the workloads, their ratios and the value checks that failed."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.ratios: dict[str, list[tuple[float, str]]] = {}

    def fail_unless(self, ok: bool | None, what: str) -> None:
        if ok is False:
            self.failures.append(what)

    def table(self, section: str, title: str, api: Row, peers: list[Row],
              same: Row | None = None, count: bool = True, logits: bool = True) -> None:
        """Print a workload: selbench from logits (``api``), selbench on the peers' inputs
        (``same``; ``api`` stands for it when None, marked ``*``) and the peers. Without
        ``logits`` (the metrics: every library takes the same inputs) only the first ratio
        is printed. Ratios go into the section's target unless ``count`` is False."""
        print(f"\n{title}")
        print(f"  {'implementation':60s} {'ms':>9s} {'ms, from':>9s} {'peer/sel':>9s} "
              f"{'peer/sel':>9s}  value check")
        print(f"  {'':60s} {'':>9s} {'logits':>9s} {'same in':>9s} {'logits':>9s}")
        dash = f"{'-':>9s}"
        from_logits = f"{api.seconds * 1e3:9.2f}" if logits else dash
        print(f"  {api.name:60s} {api.seconds * 1e3:9.2f} {from_logits} {'':9s} {'':9s}  "
              f"{api.check}")
        base = same if same is not None else api
        star = "*" if same is None and logits else " "
        if same is not None:
            print(f"  {same.name:60s} {same.seconds * 1e3:9.2f} {'':>9s} {'':9s} {'':9s}  "
                  f"{same.check}")
        for row in peers:
            ratios = [("same inputs", row.seconds / base.seconds)]
            if logits:
                ratios.append(("from logits", (row.seconds + row.prep) / api.seconds))
            name = row.name + ("" if row.same_definition else " [other definition]")
            slower = [what for what, r in ratios if r < 1.0]
            flag = ""
            if slower:
                flag = (f"  <-- selbench SLOWER ({', '.join(slower)})" if count
                        else "  <-- faster (another quantity; not a target)")
            cols = (f"{(row.seconds + row.prep) * 1e3:9.2f} {ratios[0][1]:8.1f}x{star}"
                    f"{ratios[1][1]:8.1f}x" if logits
                    else f"{dash} {ratios[0][1]:8.1f}x{star}{dash}")
            print(f"  {name:60s} {row.seconds * 1e3:9.2f} {cols}  {row.check}{flag}")
            if count:
                for what, r in ratios:
                    self.ratios.setdefault(section, []).append(
                        (r, f"{title}: {row.name} ({what})"))

    def check(self) -> None:
        """End the benchmark with the value checks that failed, if any (exit status 1)."""
        if self.failures:
            raise SystemExit("values disagree beyond the stated tolerance:\n  "
                             + "\n  ".join(self.failures))

    def summary(self, section: str, label: str) -> list[str]:
        rows = self.ratios.get(section)
        if not rows:
            return []
        ratio, where = min(rows)
        slower = sum(r < 1.0 for r, _ in rows)
        return [target(f"{label}: no peer faster on any row", slower == 0,
                       f"{slower} of {len(rows)} ratios below 1; smallest {ratio:.2f}x "
                       f"({where})")]
