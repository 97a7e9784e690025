"""Training: the engine that trains many replicas of a method as one model
(:mod:`~selbench.training.engine`) and the torch helpers plugins build on
(:mod:`~selbench.training.torchutils`: devices, seeding, threads, the batched MLP).

Part of the plugin toolkit: a plugin that imports these modules is keyed on their source.
May import: :mod:`selbench.contract`, :mod:`selbench.util`.
"""
