"""Repository-level pytest configuration.

``pytester`` drives the plugin end to end from the plugin's own tests in ``tests/``; it must be
declared in the rootdir conftest (pytest refuses ``pytest_plugins`` in nested conftests).
"""

pytest_plugins = ["pytester"]
