"""ModelCacheNode status: the shape the agent writes, built by pure functions.

Status fields: phase, localPath, progress{bytesDone,bytesTotal, and bytesPerSecond,etaSeconds while
Downloading}, resolvedRevision, revision (the spec revision resolvedRevision answers),
sizeBytes, lastUsedTime (RFC 3339), message, observedGeneration, next (a revision fetched
beside the served one during a rolling update: agent/rolling.py), xet (the last download's Xet
files and fallbacks to resolve/, `xet_report`) and conditions:

* `Ready`: True (reason `Cached`) or False with the reason why not: `Pending`,
  `Downloading`, a downloader reason (`RepoNotFound`, `Unauthorized`, ...),
  `BasePathMissing`, `WaitingForSecret`, `InvalidSpec` or `Evicted`;
* `SizeWithinRequest`: False with reason `SizeExceedsRequest` when a copy already
  complete on the node is larger than `spec.size` (pre-baked, or cached before the
  limit); a download that large is refused before writing (`Ready` False, reason
  `SizeExceedsRequest`).
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from typing import Any

from praesto import names, progress
from praesto.quantity import format_bytes

READY = "Ready"
SIZE_WITHIN_REQUEST = "SizeWithinRequest"

REASON_CACHED = "Cached"
REASON_PENDING = "Pending"
REASON_DOWNLOADING = "Downloading"
REASON_BASE_PATH_MISSING = "BasePathMissing"
REASON_WAITING_FOR_SECRET = "WaitingForSecret"  # noqa: S105 - a reason, not a secret
REASON_EVICTED = "Evicted"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_SIZE_EXCEEDS_REQUEST = "SizeExceedsRequest"
REASON_SIZE_OK = "SizeWithinRequest"


def rfc3339(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def condition(
    type_: str, ok: bool, reason: str, message: str, now: float, previous: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """A condition whose lastTransitionTime moves only when its status changes."""
    status = "True" if ok else "False"
    since = rfc3339(now)
    for old in previous or []:
        if old.get("type") == type_ and old.get("status") == status and old.get("lastTransitionTime"):
            since = old["lastTransitionTime"]
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }


def size_condition(
    previous: list[dict[str, Any]] | None, limit: int | None, size: int, now: float
) -> dict[str, Any]:
    """SizeWithinRequest of a complete copy of `size` bytes against spec.size (`limit`)."""
    if limit is not None and size > limit:
        msg = (
            f"the copy on this node is {format_bytes(size)}, more than spec.size "
            f"{format_bytes(limit)}; it was already complete here (pre-baked, or cached before "
            "storage.size became a limit) and is served, but a new download this large is refused; "
            "raise storage.size on the ModelCache to match"
        )
        return condition(SIZE_WITHIN_REQUEST, False, REASON_SIZE_EXCEEDS_REQUEST, msg, now, previous)
    return condition(SIZE_WITHIN_REQUEST, True, REASON_SIZE_OK, "", now, previous)


def with_conditions(
    current: dict[str, Any], fields: dict[str, Any], conditions: list[dict[str, Any]]
) -> dict[str, Any]:
    """`fields` plus the given conditions, keeping conditions of other types from `current`."""
    kept = [
        c for c in current.get("conditions") or [] if c.get("type") not in {c2["type"] for c2 in conditions}
    ]
    return {**fields, "conditions": sorted(kept + conditions, key=lambda c: str(c.get("type")))}


class Throttle:
    """At most one `allow()` per `interval` seconds per key (progress patches)."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
        self.interval, self.clock = interval, clock
        self._last: dict[str, float] = {}

    def allow(self, key: str) -> bool:
        now = self.clock()
        if now - self._last.get(key, float("-inf")) < self.interval:
            return False
        self._last[key] = now
        return True

    def forget(self, key: str) -> None:
        self._last.pop(key, None)


def status_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """Merge patch turning `current` status into `desired` (None removes a field); {} when equal.

    Objects are diffed key by key: a merge patch merges into an object, so a key left out of the
    new one (progress.bytesPerSecond once Ready) would otherwise stay on the server."""
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        old = current.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            if old != value:
                patch[key] = status_patch(old, value)
        elif old != value:
            patch[key] = value
    for key in current:
        if key not in desired:
            patch[key] = None
    return patch


def xet_report(files: int, cas_bytes: int, fallbacks: dict[str, int]) -> dict[str, Any]:
    """status.xet for a download that ended: how many files came through the Xet CAS, its bytes, and
    how many fell back to resolve/ by cause (download/origins/huggingface/xetpath.py), so a user
    sees a stalling CAS on the copy, not only in the agent's log and metrics; {} when Xet played
    no part (the field goes)."""
    if not files and not any(fallbacks.values()):
        return {}
    report: dict[str, Any] = {"files": files, "bytesFromCas": cas_bytes}
    fell_back = {cause: n for cause, n in fallbacks.items() if n}
    return {**report, "fallbacks": fell_back} if fell_back else report


def phase_of(obj: dict[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


def ready_reason(status: dict[str, Any]) -> str:
    for c in status.get("conditions") or []:
        if c.get("type") == READY:
            return str(c.get("reason"))
    return ""


def parse_time(text: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return 0.0


def desired(
    current: dict[str, Any],
    phase: str,
    reason: str,
    message: str,
    now: float,
    fields: dict[str, Any],
    extra: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], bool]:
    """(merge patch from `current`, whether phase or Ready reason changed) for the given state.

    `fields` set status fields; a None value removes one. The Ready condition
    follows `phase`/`reason`; `extra` conditions replace those of their type.
    Outside Downloading, progress keeps its counts but not its rate and time left.
    """
    want = dict(current)
    for key, value in {"phase": phase, "message": message, **fields}.items():
        if value is None:
            want.pop(key, None)
        else:
            want[key] = value
    if phase != names.PHASE_DOWNLOADING and isinstance(want.get("progress"), dict):
        want["progress"] = progress.without_rate(want["progress"])  # a rate only while bytes move
    ready = condition(READY, phase == names.PHASE_READY, reason, message, now, current.get("conditions"))
    want = with_conditions(want, want, [ready, *(extra or [])])
    changed = phase != current.get("phase") or reason != ready_reason(current)
    return status_patch(current, want), changed
