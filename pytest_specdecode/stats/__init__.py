"""The statistics: one measured sample against its baseline, with honest uncertainty.

``comparison`` is the entry point (:func:`~pytest_specdecode.stats.comparison.compare`: the CI of
current/baseline, the verdict against a signed margin with the no-change guard, p and MDE). Under
it: ``two_level`` (runs nested in server launches, the Kalibera-Jones estimate and the launch
variance that history gives), ``intervals`` (each method's interval on the log scale),
``power_analysis`` (minimum detectable effect, runs needed), ``sequential`` (the alpha-spending
plan of repeated looks) and its disk memo ``calibration_cache``, ``samples`` (describing and
checking one sample), ``welch`` (the standard error and df they share), ``distributions`` (t,
normal and chi-square from ``scipy.special``) and ``lazy`` (scipy imported at first use).
docs/statistics.md has the reasoning.

The face imports nothing: modules inside the package import the submodule they use, so that
a process that never compares never loads scipy.
"""
