"""Measurement: every number a cell holds. The metric definitions and their registry
(:mod:`~selbench.measure.metrics`), equal-mass binning and the binned calibration errors
(:mod:`~selbench.measure.binning`), the smooth and class-wise calibration errors
(:mod:`~selbench.measure.smooth`), the risk-coverage metrics
(:mod:`~selbench.measure.riskcoverage`), bootstrap intervals
(:mod:`~selbench.measure.bootstrap`; a cell re-measured on resamples:
:mod:`~selbench.measure.resampled`), statistics over seeds (:mod:`~selbench.measure.stats`)
and how a cell is evaluated (:mod:`~selbench.measure.evaluate`).

The source of these modules is part of every cell's key (:func:`selbench.execution.codeid.core_digest`).
May import: :mod:`selbench.contract`, :mod:`selbench.util`. Public face: :mod:`selbench.metrics`.
"""
