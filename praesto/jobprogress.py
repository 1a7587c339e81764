"""PVC mode's live progress: the one annotation a download Pod writes on its own Job. Pure.

The download Job has no other way to say how far it got while it runs (its status changes only
when its Pod ends). `praesto-agent download` writes `praesto.io/progress` (compact JSON: bytes
done and total, the rate over praesto/progress.py's window, the time left, when) at most every
REPORT_SECONDS; Metacontroller re-syncs the ModelCache on the Job's change and the sync hook reads
it into status.progress. The writer is a Pod a tenant can influence, so the reader trusts it for
display only: anything malformed or larger than MAX_CHARS is ignored, the numbers are clamped
(never above the cache's storage.size), and the time left is recomputed from the clamped numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from praesto import progress

REPORT_SECONDS = 5.0  # at most one Job patch (and so one ModelCache sync) per download this often
MAX_CHARS = 512  # the chart's ValidatingAdmissionPolicy refuses a longer value too
STALE_SECONDS = 90.0  # a report older (or further ahead of the hooks' clock) shows no rate or time left
HEARTBEAT_SECONDS = STALE_SECONDS / 3  # an unchanged report is written again this often, to stay fresh
MAX_RATE = 1 << 40  # 1 TiB/s: above any link; a larger claim is clamped, not believed
UPDATED_AT = "updatedAt"


def _format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def encode(done: int, total: int, rate: float | None, at: datetime) -> str:
    """The annotation's value: progress.progress_fields plus when, as compact JSON."""
    fields: dict[str, Any] = dict(progress.progress_fields(done, total, rate))
    fields[UPDATED_AT] = _format_time(at)
    return json.dumps(fields, separators=(",", ":"), sort_keys=True)


def _count(value: Any, ceiling: int) -> int | None:
    """A non-negative whole number clamped to `ceiling`, or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return min(max(int(value), 0), ceiling)


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def decode(value: Any, size_limit: int, now: datetime) -> dict[str, Any] | None:
    """status.progress from the annotation's value, or None when it is missing or malformed.

    `size_limit` is the cache's storage.size (the downloader refuses a larger source, so no honest
    report exceeds it). The rate and time left are shown only for a fresh report.
    """
    if not isinstance(value, str) or len(value) > MAX_CHARS or size_limit <= 0:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    total = _count(data.get(progress.BYTES_TOTAL), size_limit)
    done = _count(data.get(progress.BYTES_DONE), total or 0)
    if total is None or done is None or total == 0:
        return None
    out: dict[str, Any] = {progress.BYTES_DONE: done, progress.BYTES_TOTAL: total}
    rate = _count(data.get(progress.BYTES_PER_SECOND), MAX_RATE)
    at = _time(data.get(UPDATED_AT))
    fresh = at is not None and abs((now - at).total_seconds()) <= STALE_SECONDS
    eta = progress.eta_seconds(done, total, rate) if fresh and rate else None
    if rate and eta is not None:
        out[progress.BYTES_PER_SECOND], out[progress.ETA_SECONDS] = rate, eta
    out[progress.SUMMARY] = progress.summary(done, total, eta=eta)
    return out


@dataclass
class Reporter:
    """Counts in, an annotation value out at most every `interval` seconds, when it changed.

    `record` is called from the download's progress callback; `due` from the one thread that
    patches the Job, so a slow API server never holds up the download.
    """

    monotonic: Callable[[], float]
    wall: Callable[[], datetime]
    interval: float = REPORT_SECONDS
    window: progress.RateWindow = field(default_factory=progress.RateWindow)
    counts: tuple[int, int] | None = None
    sent_at: float | None = None
    sent: dict[str, int] | None = None

    def record(self, done: int, total: int) -> None:
        self.window = self.window.add(self.monotonic(), done)
        self.counts = (done, total)

    def due(self) -> str | None:
        """The value to write now, or None: too soon, nothing counted yet, or nothing new since the
        last write and that write is younger than HEARTBEAT_SECONDS (which keeps a report fresh)."""
        now = self.monotonic()
        if self.counts is None or (self.sent_at is not None and now - self.sent_at < self.interval):
            return None
        rate = self.window.rate()
        fields = progress.progress_fields(*self.counts, rate)
        if fields == self.sent and self.sent_at is not None and now - self.sent_at < HEARTBEAT_SECONDS:
            return None
        self.sent_at, self.sent = now, fields
        return encode(*self.counts, rate, self.wall())
