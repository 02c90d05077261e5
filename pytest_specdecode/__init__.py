"""pytest-specdecode: performance-regression tests for speculative-decoding LLM servers.

The package is plain Python; only :mod:`pytest_specdecode.plugin` imports pytest.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
