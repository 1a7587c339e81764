"""Floods against a real `praesto-hooks` at the chart's defaults: two workers of four threads, TLS (#37 item 5).

(a) A client that declares a large body and sends nothing must not hold the workers' large-body
turn: a cache's sync request carries its related Nodes, so a few dozen real Nodes pass 256 KiB.
(b) Thousands of half-open connections must not starve `/healthz` or a sync: a worker holds 4000
connections, a client address 100 incomplete ones per worker, and at a bound the connection
silent the longest is closed. Before, 2,200 filled gunicorn's 2 x 1000 and new ones waited in
the backlog for each wave's deadline. The floods come from other loopback addresses
(127.0.0.2...), as other Pods would; the real clients from 127.0.0.1.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from praesto.hooks.arrivals import BODY_GRACE
from praesto.hooks.serving.server import OTHER_FILES, open_files_for
from praesto.hooks.serving.whole_request_worker import SMALL_BODY, WORKER_CONNECTIONS

from testkit.hook_floods import SYNC_PATH, HalfOpenFlood, SilentLargeBodies, large_sync_request, sync_body
from testkit.server import RunningServer, get_text, hooks_server, post_json
from tests.hooks.test_hooks_server import ENV

# praesto-hooks under an open-files limit of 1100, as a container may start it.
LIMITED_FILES = [sys.executable, "-c", "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (1100, 1100)); "
                 "from praesto.hooks.serving.server import main; sys.exit(main(sys.argv[1:]))"]  # fmt: skip
SERVE_BOUND = 3.0  # one sync or probe behind the flood (its wait for a turn included); the deadline is 10 s


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # The chart's arguments: --workers=2, threads at their default (4), no limit flags.
    with hooks_server(tmp_path_factory.mktemp("floods"), tls=True, env=ENV, workers=2, threads=4) as running:
        yield running


def _timed_sync(server: RunningServer, body: bytes) -> tuple[int, Any, float]:
    started = time.monotonic()
    status, answer = post_json(server, SYNC_PATH, None, raw=body, timeout=15)
    return status, answer, time.monotonic() - started


def _timed_healthz(server: RunningServer) -> tuple[int, float]:
    started = time.monotonic()
    status, _ = get_text(server, "/healthz", timeout=15)
    return status, time.monotonic() - started


def test_a_large_sync_is_a_real_caches_sync_over_the_small_body_limit() -> None:
    assert len(sync_body(large_sync_request())) > SMALL_BODY  # ~300 KiB: 25 Nodes of ~12 KiB


def test_silent_large_bodies_do_not_starve_large_syncs(server: RunningServer) -> None:
    body = sync_body(large_sync_request())
    with SilentLargeBodies(server, count=4, source="127.0.0.2") as attackers:
        attackers.wait_holding()
        for _ in range(6):
            status, answer, took = _timed_sync(server, body)
            assert status == 200, (status, answer)
            assert took < SERVE_BOUND + BODY_GRACE, f"a 300 KiB sync took {took:.2f}s behind silent bodies"
    assert attackers.cut, "no silent body was cut"
    assert all(s.startswith(b"HTTP/1.1 408") for s in attackers.cut), attackers.cut


def test_a_silent_large_body_loses_its_slot_after_the_grace(server: RunningServer) -> None:
    with SilentLargeBodies(server, count=1, source="127.0.0.3") as attacker:
        attacker.wait_holding()
        deadline = time.monotonic() + BODY_GRACE + 3
        while not attacker.cut and time.monotonic() < deadline:
            attacker.stop.wait(0.05)
    assert attacker.cut, "the silent body still holds the slot"
    status, message = attacker.cut[0], attacker.messages[0]
    assert status.startswith(b"HTTP/1.1 408") and "bytes/s" in message, (status, message)


@pytest.mark.parametrize("sources", [1, 22], ids=["one-address", "many-addresses"])
def test_half_open_floods_do_not_starve_healthz_or_syncs(server: RunningServer, sources: int) -> None:
    """One address: past its cap its silent-longest connections are closed as it opens more.
    22 addresses of 100: the workers' connections (2 x 4000) hold them all, and nothing waits."""
    _serves_through_a_flood(server, sources)


def test_a_worker_at_its_open_files_limit_sheds_the_silent_longest(tmp_path: Path) -> None:
    """A soft limit of 1100 open files (a container's 1024, say, with no higher hard limit) leaves
    one worker about 1000 connections: 2,200 from 22 addresses fill it, and the worker closes
    the silent longest of any address to take each new one, /healthz's and syncs' included."""
    with hooks_server(tmp_path, tls=True, env=ENV, workers=1, threads=4, command=LIMITED_FILES) as server:
        assert _serves_through_a_flood(server, 22), "the flood never filled the worker"


def _serves_through_a_flood(server: RunningServer, sources: int) -> bool:
    """/healthz and a sync answer promptly, five times, behind 2,200 half-open connections; whether any was shed."""
    body = sync_body(large_sync_request(nodes=2))
    with HalfOpenFlood(server, count=2200, sources=sources) as flood:
        flood.wait_connected()
        for _ in range(5):
            status, took = _timed_healthz(server)
            assert status == 200 and took < SERVE_BOUND, (
                f"/healthz took {took:.2f}s behind {flood.count} connections"
            )
            status, answer, took = _timed_sync(server, body)
            assert status == 200 and took < SERVE_BOUND, (status, took, answer)
    if sources == 1:
        assert flood.cut, "one address held more than its cap"
    return bool(flood.cut)


def test_a_shed_connection_is_told_why(server: RunningServer) -> None:
    # 300 from one address: one of the two workers takes more than its cap of 100.
    with HalfOpenFlood(server, count=300, sources=1, partial_head=True, reopen=False) as flood:
        deadline = time.monotonic() + 5
        while not flood.messages and time.monotonic() < deadline:
            flood.stop.wait(0.05)
    assert flood.messages, "no connection was shed"
    assert "hooks.maxConnectionsPerClient" in flood.messages[0] and "127.0.0.2" in flood.messages[0]
    assert all(status.startswith(b"HTTP/1.1 408") for status in flood.cut if status), flood.cut


def test_the_open_files_limit_is_raised_toward_the_workers_connections() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        allowed = open_files_for(WORKER_CONNECTIONS)
        raised, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard >= WORKER_CONNECTIONS + OTHER_FILES:
            assert allowed == WORKER_CONNECTIONS and raised == WORKER_CONNECTIONS + OTHER_FILES
        else:  # the hard limit caps it: the worker takes what it leaves
            assert allowed == hard - OTHER_FILES and raised == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
