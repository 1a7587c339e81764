"""The PVC download's progress reports: their cadence (pure) and the thread that writes them.

The thin edge is the patcher; here a fake that records what it was given, or fails.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from praesto.agent import job_progress

from praesto import jobprogress, names, progress
from testkit.controlplane import wait_for

START = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return START + timedelta(seconds=self.now)


def reporter(clock: Clock) -> jobprogress.Reporter:
    return jobprogress.Reporter(monotonic=clock.monotonic, wall=clock.wall)


def test_at_most_one_report_per_interval_and_none_before_counts() -> None:
    clock = Clock()
    told = reporter(clock)
    assert told.due() is None  # nothing counted yet
    sent = []
    for second in range(0, 21):  # 1 MiB/s for 20 s, asked every second
        clock.now = float(second)
        told.record(second * 2**20, 40 * 2**20)
        value = told.due()
        if value is not None:
            sent.append((second, json.loads(value)))
    assert [s for s, _ in sent] == [0, 5, 10, 15, 20]
    last = sent[-1][1]
    assert last[progress.BYTES_PER_SECOND] == 2**20 and last[progress.ETA_SECONDS] == 20
    assert last[jobprogress.UPDATED_AT] == "2026-12-01T12:00:20Z"
    assert len(json.dumps(last)) < jobprogress.MAX_CHARS
    assert jobprogress.decode(json.dumps(last), 40 * 2**20, clock.wall()) == {
        progress.BYTES_DONE: 20 * 2**20,
        progress.BYTES_TOTAL: 40 * 2**20,
        progress.BYTES_PER_SECOND: 2**20,
        progress.ETA_SECONDS: 20,
        progress.SUMMARY: "50% of 40.0 MiB, ~20s left",
    }  # what the hook shows: the same numbers, read back


def test_an_unchanged_report_is_written_again_only_as_a_heartbeat() -> None:
    clock = Clock()
    told = reporter(clock)
    told.record(10, 100)
    assert told.due() is not None
    written = []
    while clock.now < jobprogress.HEARTBEAT_SECONDS * 2:
        clock.now += 1.0
        told.record(10, 100)  # stalled: the rate is 0, so no rate is reported, and nothing changes
        if told.due() is not None:
            written.append(clock.now)
    assert written == [jobprogress.HEARTBEAT_SECONDS, jobprogress.HEARTBEAT_SECONDS * 2]


def test_the_sender_writes_what_is_due_and_a_failure_never_stops_it(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    values: list[str] = []
    failing = threading.Event()
    failing.set()

    def patch(value: str) -> None:
        if failing.is_set():
            raise OSError("connection refused")
        values.append(value)

    sender = job_progress.ProgressSender(patch, reporter(clock), tick=0.01)
    sender.record(1, 10)
    with caplog.at_level(logging.WARNING, "praesto.agent.download"):
        sender.send_due()
        clock.now += jobprogress.REPORT_SECONDS
        sender.send_due()  # the same failure again: logged once
    assert [r.getMessage() for r in caplog.records] == [
        "could not write live progress on the Job (OSError: connection refused); the download goes on"
    ]
    failing.clear()
    sender.start()
    clock.now += jobprogress.REPORT_SECONDS
    sender.record(5, 10)
    wait_for("the sender thread to write the report", lambda: bool(values), 10)
    sender.stop()
    assert json.loads(values[0])[progress.BYTES_DONE] == 5
    assert not sender.thread.is_alive()


@pytest.mark.parametrize("text", ["job", "/job", "ns/", "ns/a/b"])
def test_a_malformed_job_reference_names_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="is not NAMESPACE/NAME"):
        job_progress.parse_job_ref(text)


def test_no_token_mounted_means_no_live_progress_and_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "praesto.agent.download"):
        assert job_progress.sender_from_env("ns/job", tmp_path, {}) is None
    assert "no live progress" in caplog.text


def test_a_malformed_progress_job_is_refused_before_any_work(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    env = {**os.environ, names.ENV_PROGRESS_JOB: "no-slash"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "praesto-agent"), "download", "hf://org/model", "--dest", str(dest)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: --progress-job 'no-slash' (from ${names.ENV_PROGRESS_JOB}) is not NAMESPACE/NAME; give the "
        "download Job as namespace/name, or leave it out to report no live progress"
    ]
    assert not dest.exists()
