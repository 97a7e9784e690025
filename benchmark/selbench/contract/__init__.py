"""The contract between selbench and its plugins: the six plugin kinds and their declared
capabilities (:mod:`~selbench.contract.api`, which re-exports the parameter machinery of
:mod:`~selbench.contract.params` and the training-engine protocols of
:mod:`~selbench.contract.modules`), the data contract
(:mod:`~selbench.contract.data`: :class:`ModelOutputs`), the input checks plugins raise with
(:mod:`~selbench.contract.checks`), the pluggy hook specifications
(:mod:`~selbench.contract.hookspecs`), declared input files (:mod:`~selbench.contract.inputs`),
image items (:mod:`~selbench.contract.vision`) and the plugin registry that loads plugins
through the ``selbench`` entry-point group (:mod:`~selbench.contract.registry`).

May import: :mod:`selbench.util`. Everything else in selbench builds on this package.
"""
