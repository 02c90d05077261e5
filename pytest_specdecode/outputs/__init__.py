"""What is written down at the end of a session, and read back later.

``terminal`` is the seed-shaped results table; ``json_report`` the versioned JSON report and the
JUnit properties; ``markdown`` the summary for CI pages; ``history`` the nightly JSON lines, which
``trend`` and ``trend_plot`` read back for ``python -m pytest_specdecode report``; ``benchmark``
the pytest-benchmark entries; ``write`` writes them all once. Every writer works on
:class:`~pytest_specdecode.result.SpecdecodeResult`s alone, so nothing here needs a server, the
HTTP client or pytest.
"""

from __future__ import annotations

from pytest_specdecode.outputs.terminal import details, results_table
from pytest_specdecode.outputs.write import write_outputs

__all__ = ["details", "results_table", "write_outputs"]
