"""A simulated SGLang server for running pytest-specdecode without a GPU.

Start it like SGLang: ``python -m pytest_specdecode.sim --model-path M --port P [SGLang flags]
[--sim-* knobs]``. It imports nothing from the package but the version and
:mod:`pytest_specdecode.sglang_releases` (what each SGLang release accepts and reports, which the
core reads too), and never pytest; nothing outside ``sim/`` imports it
(``tests/unit/test_architecture.py``).
"""

from __future__ import annotations
