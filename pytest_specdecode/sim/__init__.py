"""A simulated SGLang server for running pytest-specdecode without a GPU.

Start it like SGLang: ``python -m pytest_specdecode.sim --model-path M --port P [SGLang flags]
[--sim-* knobs]``. It imports nothing from the package but the version, and never pytest.
"""

from __future__ import annotations
