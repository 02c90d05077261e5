"""What a result is compared with: stored baselines.

``record`` is one baseline (samples, summary, workload hash, fingerprint, provenance) and its
JSON; ``store`` the reviewable files under ``baselines/`` (atomic writes, locks, old → new, the
noise rule); ``refs`` resolves a test's references to comparable samples or to the reason there
are none.
"""

from __future__ import annotations

from pytest_specdecode.baselines.baseline import BaselineRecord
from pytest_specdecode.baselines.refs import BaselineLookup
from pytest_specdecode.baselines.store import BaselineStore, BaselineUpdate
from pytest_specdecode.verdict import BaselineRef

__all__ = ["BaselineLookup", "BaselineRecord", "BaselineRef", "BaselineStore", "BaselineUpdate"]
