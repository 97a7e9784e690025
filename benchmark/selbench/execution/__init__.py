"""The run: from a resolved spec to written cells. Planning cells and their keys, extracting
backbone outputs, fitting and evaluating cells (:mod:`~selbench.execution.runner`), where
they run (:mod:`~selbench.execution.executors`: inline, a local pool, Slurm) and the code
digests in every key (:mod:`~selbench.execution.codeid`).

May import every layer below it: :mod:`selbench.reporting`, :mod:`selbench.library`,
:mod:`selbench.store`, :mod:`selbench.spec`, :mod:`selbench.measure`,
:mod:`selbench.training`, :mod:`selbench.contract`, :mod:`selbench.util`.
"""
