"""Reporting: leaderboards (:mod:`~selbench.reporting.leaderboard`: tables over seeds as
Markdown, CSV and JSON, from the cells :mod:`~selbench.reporting.loading` reads and checks),
figures (:mod:`~selbench.reporting.figures` draws them from plain arrays,
:mod:`~selbench.reporting.plots` writes a results folder's), and the reproduction check
(:mod:`~selbench.reporting.compare`: do two leaderboards agree within their noise?), built only
from results folders.

May import: :mod:`selbench.store`, :mod:`selbench.measure`, :mod:`selbench.contract`,
:mod:`selbench.util`.
"""
