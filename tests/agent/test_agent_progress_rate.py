"""A copy's rate and time left, as the real API server keeps them: written while the bytes move,
gone once Ready (a merge patch must null them), and the REASON/MESSAGE columns as `kubectl get` prints them.
Every status the agent writes is read from a watch (testkit/status_watch.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from praesto import names, progress, store
from testkit.agent_harness import NODE, Env, env_context
from testkit.kube_real import RealKube
from testkit.printer_columns import printed_columns
from testkit.status_watch import StatusLog

MiB = 1 << 20


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def test_rate_and_time_left_while_downloading_gone_when_ready(env: Env) -> None:
    size = 4 * MiB  # one part, one connection: the hub's rate is the download's
    env.add_model("paced", **{"w.bin": os.urandom(size)})
    env.hub.faults.rate = MiB  # bytes/s: about four seconds
    name = names.modelcachenode_name("paced", NODE)
    log = StatusLog(env.kube.admin, names.MODELCACHENODE_PLURAL, "team-a", name, names.PHASE_READY)
    env.create_mcn("paced")
    env.start(progress_seconds=0.5, concurrency=1)
    statuses = log.wait()

    timed = [s for s in statuses if progress.BYTES_PER_SECOND in (s.get("progress") or {})]
    assert timed, [s.get("progress") for s in statuses]
    for status in timed:  # only while Downloading, and plausible for a paced 1 MiB/s
        counts = status["progress"]
        assert status["phase"] == names.PHASE_DOWNLOADING
        assert MiB // 4 <= counts[progress.BYTES_PER_SECOND] <= 4 * MiB, counts
        done, eta = counts[progress.BYTES_DONE], counts[progress.ETA_SECONDS]
        assert abs(eta - (size - done) / counts[progress.BYTES_PER_SECOND]) <= 1, (
            counts
        )  # rate written rounded
        assert status["message"] == f"downloading {progress.summary(done, size, eta=eta)}"
    assert any(", ~" in s["message"] and s["message"].endswith("s left") for s in timed), timed
    ready = statuses[-1]
    assert ready["progress"] == {"bytesDone": size, "bytesTotal": size}  # nulled by the patch, not left over
    assert store.read_progress(env.layout, "team-a", "paced") is None

    columns = printed_columns(env.kube.admin, names.API_VERSION, names.MODELCACHENODE_PLURAL, "team-a", name)
    assert (columns["PHASE"], columns["REASON"]) == (names.PHASE_READY, "Cached")
    assert columns["MESSAGE"] == ready["message"] and "cached at revision" in columns["MESSAGE"]
