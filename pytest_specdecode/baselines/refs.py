"""Which stored samples a test compares with: its own baseline and, for ``against=``, another
profile's, each checked before any comparison.

A reference resolves to a :class:`~pytest_specdecode.verdict.BaselineRef`: samples to compare
with, or the reason there are none (no baseline yet, an unreadable file, a hard fingerprint
mismatch, a changed workload). A hard mismatch is never compared silently; a soft one (another
SGLang version, driver) is compared with a warning. The lookup never calls back into the
session: everything it needs is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_specdecode.baselines.baseline import BaselineRecord, check_fingerprint
from pytest_specdecode.baselines.store import BaselineStore
from pytest_specdecode.errors import BaselineError
from pytest_specdecode.fingerprint import Fingerprint
from pytest_specdecode.metrics import METRICS
from pytest_specdecode.verdict import BaselineRef

OWN = None
"""The key of a test's own baseline among its references (others are keyed by profile name)."""


@dataclass(frozen=True)
class BaselineLookup:
    """Resolves a test's references on one hardware key for one workload."""

    store: BaselineStore
    hardware_key: str
    workload_name: str
    workload_hash: str
    workload_fields: Mapping[str, object] | None = None
    """This run's :meth:`~pytest_specdecode.workloads.Workload.hashed_fields`, to name what
    changed against a baseline that stored its own (``provenance["workload"]``)."""
    recorders: Mapping[str, str] = field(default_factory=dict)
    """Per ``against=`` profile: which tests of this session would record its baseline (or that
    none does), for the message when it has none."""

    def resolve(
        self,
        test_id: str,
        fingerprint: Fingerprint,
        others: Mapping[str, Fingerprint] | None = None,
    ) -> tuple[dict[str | None, BaselineRef], list[str]]:
        """The test's own reference (key :data:`OWN`) and one per profile in ``others`` (name →
        that profile's fingerprint), with the warnings of soft fingerprint differences."""
        warnings: list[str] = []
        refs: dict[str | None, BaselineRef] = {OWN: self._own(test_id, fingerprint, warnings)}
        for name, other in (others or {}).items():
            refs[name] = self._other(name, other, warnings)
        return refs, warnings

    def _own(self, test_id: str, fingerprint: Fingerprint, warnings: list[str]) -> BaselineRef:
        label = "its own baseline"
        path = str(self.store.path_for(self.hardware_key, test_id))
        try:
            record = self.store.load(self.hardware_key, test_id)
        except BaselineError as exc:
            return BaselineRef(label, None, path, str(exc), mismatch=True)
        missing = (
            f"no baseline for {test_id} on hardware {self.hardware_key!r} (expected at {path}); "
            "record one with --update-baselines"
        )
        return self._checked(record, label, path, fingerprint, warnings, missing=missing)

    def _other(self, name: str, fingerprint: Fingerprint, warnings: list[str]) -> BaselineRef:
        found = self.store.find_for_profile(self.hardware_key, name, self.workload_hash)
        record = max(found, key=lambda r: r.created_unix) if found else None
        path = str(self.store.path_for(self.hardware_key, record.test_id)) if record else None
        missing = (
            f"no stored baseline of profile {name!r} on hardware {self.hardware_key!r} for "
            f"workload {self.workload_name!r} (hash {self.workload_hash}). against= compares "
            "with the baseline a test of that profile records on the same workload; "
            + self.recorders.get(name, "run that profile's test with --update-baselines first")
        )
        return self._checked(
            record, f"{name}'s baseline", path, fingerprint, warnings, missing=missing
        )

    def _checked(
        self,
        record: BaselineRecord | None,
        label: str,
        path: str | None,
        fingerprint: Fingerprint,
        warnings: list[str],
        *,
        missing: str,
    ) -> BaselineRef:
        if record is None:
            return BaselineRef(label, None, path, missing)
        check = check_fingerprint(record, fingerprint)
        if check.hard:
            return BaselineRef(label, None, path, check.error_message(path or ""), mismatch=True)
        if record.workload_hash != self.workload_hash:
            return BaselineRef(
                label,
                None,
                path,
                f"{path}: recorded with workload {record.workload_name!r} hash "
                f"{record.workload_hash}, this run's workload {self.workload_name!r} hashes to "
                f"{self.workload_hash}: {self._workload_change(record)}, so the runs are not "
                "comparable; re-record with --update-baselines",
                mismatch=True,
            )
        if check.soft:
            warnings.append(check.warning_message())
        notes = {m: note for m in METRICS if (note := record.missing_metric_note(m)) is not None}
        return BaselineRef(
            label,
            record.samples,
            path,
            notes=notes,
            launch_runs=record.launch_runs,
            machine_load=record.provenance.get("machine_load"),
        )

    def _workload_change(self, record: BaselineRecord) -> str:
        """The workload fields that differ, as ``field: baseline X, now Y``."""
        stored = record.provenance.get("workload")
        if not isinstance(stored, Mapping) or self.workload_fields is None:
            return (
                "the prompts, output length, temperature, concurrency or API changed (this "
                "baseline does not store its workload's fields; a re-recorded one will)"
            )
        changed = [
            f"{key} was {stored.get(key)!r}, now {value!r}"
            for key, value in self.workload_fields.items()
            if stored.get(key) != value
        ]
        return "; ".join(changed) if changed else "the prompt order changed"
