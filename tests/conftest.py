"""Shared by every test folder: the pytest runs the tests start must not think they are xdist
workers when the plugin's own suite runs under ``-n``.

pytest-xdist exports ``PYTEST_XDIST_WORKER`` (and friends) to its workers, and a pytester
subprocess inherits them: pytest-benchmark then disables itself with a warning on stderr, and
the plugin's own controller/worker logic would see a worker where there is none.
"""

from __future__ import annotations

import pytest

XDIST_WORKER_VARIABLES = (
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
)


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in XDIST_WORKER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
