"""The messages a Pod's events show while its model is not on the node yet."""

from __future__ import annotations

import grpc
from praesto.csi.waiting import waiting_answer

from praesto import names
from praesto.store import Progress

GiB = 1024**3


def test_downloading_shows_percent_and_size() -> None:
    progress = Progress(
        names.PHASE_DOWNLOADING, bytes_done=int(4.1 * GiB * 0.41) + 1, bytes_total=int(4.1 * GiB)
    )
    answer = waiting_answer("default", "tinyllama", "n1", progress, 5, 60)
    assert answer.code == grpc.StatusCode.UNAVAILABLE
    assert answer.message == "model cache default/tinyllama is downloading on node n1: 41% of 4.1 GiB"


def test_downloading_shows_time_left_when_the_agent_knows_it() -> None:
    """The agent's estimate (progress file `eta_seconds`), in the PROGRESS column's words (praesto/progress.py)."""
    total = int(4.1 * GiB)
    progress = Progress(
        names.PHASE_DOWNLOADING, bytes_done=total * 41 // 100 + 1, bytes_total=total, eta_seconds=100
    )
    answer = waiting_answer("default", "tinyllama", "n1", progress, 5, 60)
    assert answer.message.endswith("is downloading on node n1: 41% of 4.1 GiB, ~2m left")


def test_downloading_without_total_shows_bytes_so_far() -> None:
    answer = waiting_answer("ns", "m", "n1", Progress(names.PHASE_DOWNLOADING, bytes_done=3 * 1024**2), 5, 60)
    assert answer.message.endswith("downloading on node n1: 3.0 MiB so far")


def test_no_progress_waits_then_says_not_assigned() -> None:
    early = waiting_answer("ns", "m", "n1", None, 10, 60)
    assert early.code == grpc.StatusCode.UNAVAILABLE
    assert "waiting for the node agent to start downloading" in early.message
    late = waiting_answer("ns", "m", "n1", None, 61, 60)
    assert late.code == grpc.StatusCode.FAILED_PRECONDITION
    assert late.message.startswith("model cache ns/m is not assigned to node n1")
    assert "nodeSelector" in late.message


def test_failed_carries_the_agents_reason() -> None:
    answer = waiting_answer(
        "ns", "m", "n1", Progress(names.PHASE_FAILED, message="repo org/x not found"), 1, 60
    )
    assert answer.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "failed to download on node n1: repo org/x not found" in answer.message


def test_evicted_and_pending_are_retryable() -> None:
    for phase in (names.PHASE_EVICTED, names.PHASE_PENDING, names.PHASE_READY):
        answer = waiting_answer("ns", "m", "n1", Progress(phase), 1000, 60)
        assert answer.code == grpc.StatusCode.UNAVAILABLE, phase
        assert "model cache ns/m" in answer.message
