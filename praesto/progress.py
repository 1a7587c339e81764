"""A download's rate, time left and one-line summary: pure, shared by the agent, the hooks and the CSI driver.

The rate is measured over a sliding window of the last RATE_WINDOW_SECONDS rather than since the
start, so it follows a download that slows down (a throttled origin, a peer gone) within half a
minute, and a single burst does not swing it the way an instantaneous rate would. The window starts
at the first count reported, not at zero: the bytes already on disk when a download resumes (or
found deduplicated) arrive as one jump and are not transfer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from praesto.quantity import format_bytes

# status.progress keys (ModelCacheNode and ModelCache; both CRDs declare them)
BYTES_DONE = "bytesDone"
BYTES_TOTAL = "bytesTotal"
BYTES_PER_SECOND = "bytesPerSecond"
ETA_SECONDS = "etaSeconds"
SUMMARY = "summary"
RATE_FIELDS = (BYTES_PER_SECOND, ETA_SECONDS)  # only while a download runs

RATE_WINDOW_SECONDS = 30.0
MIN_SPAN_SECONDS = 1.0  # a rate measured over less than this is noise: unknown instead
SAMPLE_SECONDS = 1.0  # one kept sample per second bounds the window to ~30 samples


@dataclass(frozen=True)
class RateWindow:
    """(monotonic time, bytes done) samples of one download over the last RATE_WINDOW_SECONDS."""

    samples: tuple[tuple[float, int], ...] = ()

    def add(self, at: float, done: int) -> RateWindow:
        """This window with the count `done` seen at `at`; a count that went back starts over."""
        if self.samples and done < self.samples[-1][1]:
            return RateWindow(((at, done),))
        kept = list(self.samples)
        # keep one sample at or beyond the window's edge, so a stall still spans the whole window
        while len(kept) >= 2 and at - kept[1][0] >= RATE_WINDOW_SECONDS:
            kept.pop(0)
        if len(kept) >= 2 and kept[-1][0] - kept[-2][0] < SAMPLE_SECONDS:
            kept[-1] = (at, done)  # the newest sample moves until it is a second from the one before
        else:
            kept.append((at, done))
        return RateWindow(tuple(kept))

    def rate(self) -> float | None:
        """Bytes per second over the window; None until it spans MIN_SPAN_SECONDS."""
        if len(self.samples) < 2:
            return None
        (first_at, first_done), (last_at, last_done) = self.samples[0], self.samples[-1]
        span = last_at - first_at
        return (last_done - first_done) / span if span >= MIN_SPAN_SECONDS else None


def eta_seconds(done: int, total: int, rate: float | None) -> int | None:
    """Whole seconds left at `rate`; None when the rate is unknown or zero, or the size unknown."""
    if rate is None or rate <= 0 or total <= 0:
        return None
    return math.ceil(max(0, total - done) / rate)


def progress_fields(done: int, total: int, rate: float | None) -> dict[str, int]:
    """status.progress of one copy: the counts, plus rate and time left when they are known."""
    fields = {BYTES_DONE: done, BYTES_TOTAL: total}
    eta = eta_seconds(done, total, rate)
    if rate is not None and eta is not None:
        fields[BYTES_PER_SECOND], fields[ETA_SECONDS] = round(rate), eta
    return fields


def without_rate(progress: Mapping[str, Any]) -> dict[str, Any]:
    """status.progress with the rate and time left taken out (the download is not running)."""
    return {k: v for k, v in progress.items() if k not in RATE_FIELDS}


def format_duration(seconds: int) -> str:
    """Short, in kubectl's style: 45s, 2m, 1h5m, 2d3h (minutes rounded up: it is a time left)."""
    if seconds < 60:
        return f"{max(seconds, 0)}s"
    minutes = math.ceil(seconds / 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def summary(done: int, total: int, size: int = 0, eta: int | None = None, nodes: int = 1) -> str:
    """`41% of 4.1 GiB, ~2m left`: the PROGRESS column and the progress messages.

    `size` is one copy's size when `done`/`total` add up several copies (`on 3 nodes` then);
    99% until every byte is there; no time-left part when `eta` is unknown or nothing is left.
    """
    if total <= 0:
        return ""
    percent = 100 if done >= total else min(99, done * 100 // total)
    text = f"{percent}% of {format_bytes(size or total)}"
    if nodes > 1:
        text += f" on {nodes} nodes"
    return text if eta is None or done >= total else f"{text}, ~{format_duration(eta)} left"
