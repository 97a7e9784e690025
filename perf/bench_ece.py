"""ECE on N = 1,000,000 examples: selbench vs the ``uncertainty-calibration`` package.

Both compute the paper's top-label ECE_1 with 15 equal-mass bins
(``calibration.lower_bound_scaling_ce(probs, labels, p=1, debias=False, num_bins=15,
binning_scheme=calibration.get_equal_bins, mode="top-label")``) on the same softmax outputs
(K classes). selbench is timed twice: from the probabilities and labels (``top_label`` then
``ece``, the library's inputs), and from the top-label confidence and correctness alone
(``ece``, what the runner computes). Each time is the best of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from common import best_of, machine, rule, target


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    import calibration
    from selbench.measure.metrics import ece, top_label

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(args.n, args.classes)) * 2.0
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    labels = (probs.cumsum(1) < rng.random((args.n, 1))).sum(1).clip(0, args.classes - 1)
    conf, correct = top_label(probs, labels)

    rule(f"ECE_1, N = {args.n:,}, K = {args.classes}: selbench vs uncertainty-calibration")
    print(machine("cpu"))
    t_lib, v_lib = best_of(lambda: calibration.lower_bound_scaling_ce(
        probs, labels, p=1, debias=False, num_bins=15,
        binning_scheme=calibration.get_equal_bins, mode="top-label"), args.repeats)
    t_probs, v_probs = best_of(lambda: ece(*top_label(probs, labels), p=1), args.repeats)
    t_conf, v_conf = best_of(lambda: ece(conf, correct, p=1), args.repeats)
    if not (abs(v_probs - v_lib) < 1e-9 and abs(v_conf - v_lib) < 1e-9):
        raise SystemExit(f"ECE values disagree: library {v_lib!r}, selbench {v_probs!r}, "
                         f"{v_conf!r}")
    print(f"{'':46s} {'seconds':>9s} {'speed-up':>9s}")
    for name, t in (("uncertainty-calibration (probs, labels)", t_lib),
                    ("selbench top_label + ece (probs, labels)", t_probs),
                    ("selbench ece (confidence, correct)", t_conf)):
        print(f"{name:46s} {t:9.4f} {t_lib / t:8.1f}x")
    print(f"ECE_1 = {v_lib:.12f} (all three agree to 1e-9)")
    return [
        target("ECE from probabilities", t_lib / t_probs >= 20,
               f"{t_lib / t_probs:.1f}x faster than the library (>= 20x)"),
        target("ECE from confidence", t_lib / t_conf >= 20,
               f"{t_lib / t_conf:.1f}x faster than the library (>= 20x)"),
    ]


if __name__ == "__main__":
    main(sys.argv[1:])
