"""The run: from a resolved spec to written cells, in the order a run goes through them.
Cell keys and provenance (:mod:`~selbench.execution.keys`, with the code digests of
:mod:`~selbench.execution.codeid`), the run's plan and settings, made once and read by every
later step (:mod:`~selbench.execution.plan`), backbone-output extraction
(:mod:`~selbench.execution.extraction`), fitting and evaluating cells
(:mod:`~selbench.execution.cells`, the blame-finding guards of
:mod:`~selbench.execution.guard`), jobs (:mod:`~selbench.execution.distributed`) and where they
run (:mod:`~selbench.execution.executors`: inline, a local pool, Slurm), the entry point
(:mod:`~selbench.execution.runner`: ``selbench run``, :func:`selbench.run`) and the typed
results it returns (:mod:`~selbench.execution.results_api`).

May import every layer below it: :mod:`selbench.reporting`, :mod:`selbench.library`,
:mod:`selbench.store`, :mod:`selbench.spec`, :mod:`selbench.measure`,
:mod:`selbench.training`, :mod:`selbench.contract`, :mod:`selbench.util`.
"""
