"""Reporting: leaderboards (:mod:`~selbench.reporting.leaderboard`: tables over seeds as
Markdown, CSV and JSON) and figures (:mod:`~selbench.reporting.plots`), built only from a
results folder.

May import: :mod:`selbench.store`, :mod:`selbench.measure`, :mod:`selbench.contract`,
:mod:`selbench.util`.
"""
