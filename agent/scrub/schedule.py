"""When each copy is due for a scrub, persisted under <base>/.praesto/scrub/ (store.scrub_record).

Due `interval` after its last scrub or, never scrubbed, after it became Ready (the completion
marker's mtime, written once at publish), so an agent restart, or a new agent version, does not
rescrub every copy at once. `force` marks a copy to scrub next: one that shares an inode with a
file another copy's scrub found bad.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from praesto.agent.scrub.core import Report

from praesto import names, store
from praesto.store import StoreLayout


@dataclass(frozen=True)
class ScrubRecord:
    last_time: float = 0.0
    result: str = ""
    files_checked: int = 0
    bytes_checked: int = 0
    mismatched: tuple[str, ...] = ()
    force: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def status(self) -> dict[str, Any]:
        """ModelCacheNode status.scrub."""
        return {
            "lastTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.last_time)),
            "result": self.result,
            "filesChecked": self.files_checked,
            "bytesChecked": self.bytes_checked,
            "mismatched": list(self.mismatched[: names.SCRUB_MISMATCHED_MAX]),
        }


def record_of(report: Report, result: str, now: float) -> ScrubRecord:
    bad = tuple(f.path for f in report.findings[: names.SCRUB_MISMATCHED_MAX])
    return ScrubRecord(now, result, report.files_checked, report.bytes_checked, bad)


def read(layout: StoreLayout, namespace: str, cache: str) -> ScrubRecord | None:
    data = store.read_json(layout.scrub_record(namespace, cache))
    if data is None:
        return None
    try:
        return ScrubRecord(
            float(data.get("lastTime", 0.0)),
            str(data.get("result", "")),
            int(data.get("filesChecked", 0)),
            int(data.get("bytesChecked", 0)),
            tuple(str(p) for p in data.get("mismatched") or []),
            bool(data.get("force", False)),
        )
    except (TypeError, ValueError):
        return None


def write(layout: StoreLayout, namespace: str, cache: str, record: ScrubRecord) -> None:
    store.write_json_atomic(
        layout.scrub_record(namespace, cache),
        {
            "lastTime": record.last_time,
            "result": record.result,
            "filesChecked": record.files_checked,
            "bytesChecked": record.bytes_checked,
            "mismatched": list(record.mismatched),
            "force": record.force,
        },
    )


def force(layout: StoreLayout, namespace: str, cache: str) -> None:
    """Scrub this copy next, whatever its schedule."""
    old = read(layout, namespace, cache) or ScrubRecord()
    write(layout, namespace, cache, ScrubRecord(old.last_time, old.result, old.files_checked,
                                                old.bytes_checked, old.mismatched, True))  # fmt: skip


def due_at(layout: StoreLayout, namespace: str, cache: str, interval: float) -> float | None:
    """When the copy is next due (None: not a complete copy); a forced copy is due at once (0)."""
    try:
        ready_since = os.stat(layout.complete_marker(namespace, cache)).st_mtime
    except OSError:
        return None
    record = read(layout, namespace, cache)
    if record is not None and record.force:
        return 0.0
    last = record.last_time if record is not None and record.last_time else 0.0
    return max(last, ready_since) + interval
