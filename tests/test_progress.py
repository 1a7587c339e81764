"""A download's rate, time left and summary (praesto/progress.py): the PROGRESS column's arithmetic."""

from __future__ import annotations

import pytest

from praesto import progress
from praesto.progress import RateWindow, eta_seconds, format_duration, progress_fields, summary

MiB = 1 << 20
GiB = 1 << 30


def window(*samples: tuple[float, int]) -> RateWindow:
    found = RateWindow()
    for at, done in samples:
        found = found.add(at, done)
    return found


def test_rate_is_unknown_until_the_window_spans_a_second() -> None:
    assert RateWindow().rate() is None
    assert window((0.0, 0)).rate() is None
    assert window((0.0, 0), (0.5, MiB)).rate() is None
    assert window((0.0, 0), (0.5, MiB), (1.0, 2 * MiB)).rate() == 2 * MiB


def test_a_steady_download_reads_its_rate() -> None:
    steady = window(*((t, t * 10 * MiB) for t in range(0, 20)))
    assert steady.rate() == pytest.approx(10 * MiB)


def test_the_rate_follows_a_slowdown_within_the_window() -> None:
    """60 s at 10 MiB/s, then 40 s at 1 MiB/s: the last 30 s say 1 MiB/s, not the average."""
    fast = [(float(t), t * 10 * MiB) for t in range(61)]
    slow = [(60.0 + t, 600 * MiB + t * MiB) for t in range(1, 41)]
    assert window(*fast, *slow).rate() == pytest.approx(MiB, rel=0.05)


def test_bytes_found_on_disk_at_the_start_are_not_transfer() -> None:
    """A resumed download reports 3 GiB at once, then moves at 1 MiB/s: the window starts at 3 GiB."""
    resumed = window((0.0, 3 * GiB), (1.0, 3 * GiB + MiB), (2.0, 3 * GiB + 2 * MiB))
    assert resumed.rate() == pytest.approx(MiB)


def test_a_count_that_goes_back_starts_over() -> None:
    again = window((0.0, 0), (5.0, 50 * MiB), (6.0, MiB))
    assert again.samples == ((6.0, MiB),) and again.rate() is None


def test_a_stall_spans_the_whole_window() -> None:
    """No bytes for a minute, then one MiB: a MiB over that minute, not a burst of one."""
    stalled = window((0.0, 0), (1.0, MiB), (61.0, 2 * MiB))
    assert stalled.samples == ((1.0, MiB), (61.0, 2 * MiB))  # the last sample before the gap anchors it
    assert stalled.rate() == pytest.approx(MiB / 60)


def test_samples_stay_bounded_when_reports_come_per_chunk() -> None:
    busy = window(*((t / 1000, t * 64 * 1024) for t in range(45_000)))  # 1000 reports a second
    assert len(busy.samples) <= progress.RATE_WINDOW_SECONDS / progress.SAMPLE_SECONDS + 3
    assert busy.rate() == pytest.approx(64 * 1024 * 1000, rel=0.01)


def test_eta_is_remaining_over_rate_and_absent_when_unknown() -> None:
    assert eta_seconds(41, 100, 10.0) == 6  # 5.9 s rounds up: it is a time left
    assert eta_seconds(100, 100, 10.0) == 0
    assert eta_seconds(0, 100, 0.0) is None
    assert eta_seconds(0, 100, None) is None
    assert eta_seconds(0, 0, 10.0) is None


def test_progress_fields_carry_rate_and_eta_only_when_known() -> None:
    assert progress_fields(10, 100, None) == {"bytesDone": 10, "bytesTotal": 100}
    assert progress_fields(10, 100, 0.0) == {"bytesDone": 10, "bytesTotal": 100}
    assert progress_fields(10, 100, 29.6) == {
        "bytesDone": 10,
        "bytesTotal": 100,
        "bytesPerSecond": 30,
        "etaSeconds": 4,
    }
    assert progress.without_rate(progress_fields(10, 100, 29.6)) == {"bytesDone": 10, "bytesTotal": 100}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (59, "59s"), (60, "1m"), (61, "2m"), (120, "2m"), (3599, "1h"),
     (3600, "1h"), (3900, "1h5m"), (86399, "1d"), (90000, "1d1h"), (2 * 86400, "2d")],
)  # fmt: skip
def test_format_duration(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text


def test_summary_reads_like_the_progress_column() -> None:
    size = int(4.1 * GiB)
    done = size * 41 // 100 + 1
    assert summary(done, size, eta=100) == "41% of 4.1 GiB, ~2m left"
    assert summary(done, size) == "41% of 4.1 GiB"  # no time left while it is unknown
    assert summary(size - 1, size) == "99% of 4.1 GiB"  # 100% only once every byte is there
    assert summary(size, size) == summary(size, size, eta=0) == "100% of 4.1 GiB"  # not "~0s left"
    assert summary(3 * done, 3 * size, size, 30, nodes=3) == "41% of 4.1 GiB on 3 nodes, ~30s left"
    assert summary(0, 0) == ""
