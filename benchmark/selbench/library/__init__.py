"""The library face: :class:`~selbench.library.estimator.SelectiveRecalibrator`, a
scikit-learn estimator that fits one method (selector, recalibrator, scheme, losses) on a
user's arrays. The runner fits every leaderboard cell through it, so a cell and a user's
estimator are the same computation.

May import: :mod:`selbench.spec`, :mod:`selbench.measure`, :mod:`selbench.training`,
:mod:`selbench.contract`, :mod:`selbench.util`.
"""
