"""praesto.reflector: its rules against a local fake stream of real-shaped watch events,
and its edge (praesto.listwatch) through the real `kubernetes` client against the real API server,
drops and expiries made on demand by the fault proxy in front of it (testkit/kube_faults.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from praesto import reflector
from praesto.listwatch import ListWatch
from praesto.reflector import Backoff, Expired, Idle, Reflector
from testkit.controlplane import wait_for
from testkit.kube_real import RealKube

Obj = dict[str, Any]
DEADLINE = 10.0
API_VERSION = "praesto.io/v1alpha1"


def obj(name: str, version: int, namespace: str = "team-a", **spec: Any) -> Obj:
    """A ModelCacheNode as the API server sends it (trimmed)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelCacheNode",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "resourceVersion": str(version),
            "generation": 1,
        },
        "spec": spec or {"nodeName": "node-a"},
    }


def event(type_: str, body: Obj) -> Obj:
    return {"type": type_, "object": body}


def bookmark(version: int) -> Obj:
    """What the API server sends for allowWatchBookmarks: only the kind and a resourceVersion."""
    return event(
        "BOOKMARK",
        {"kind": "ModelCacheNode", "apiVersion": API_VERSION, "metadata": {"resourceVersion": str(version)}},
    )


def status_error(code: int, reason: str, message: str) -> Obj:
    """An ERROR event carrying a metav1.Status, as the API server ends a watch with."""
    return event(
        "ERROR",
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
         "message": message, "reason": reason, "code": code},
    )  # fmt: skip


class Dropped(ConnectionError):
    """The connection cut mid-stream (urllib3's ProtocolError in production)."""


class FakeServer:
    """Scripted list/watch answers. Each watch script is a list of events; an exception in it is
    raised at that point; an exception instead of a list is raised at connect. When the scripts run
    out, the reflector is stopped."""

    def __init__(self, lists: list[tuple[list[Obj], str] | Exception], watches: list[Any]) -> None:
        self.lists, self.watches = list(lists), list(watches)
        self.list_calls = 0
        self.watch_calls: list[str] = []
        self.stop = threading.Event()

    def list_fn(self) -> tuple[list[Obj], str]:
        self.list_calls += 1
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watch_fn(self, version: str) -> Iterator[Obj]:
        self.watch_calls.append(version)
        if not self.watches:
            self.stop.set()
            return iter(())
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        return self._play(script)

    @staticmethod
    def _play(script: list[Any]) -> Iterator[Obj]:
        for item in script:
            if isinstance(item, Exception):
                raise item
            yield item


def run(server: FakeServer, **kwargs: Any) -> tuple[Reflector, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    kwargs.setdefault("on_event", lambda t, o: seen.append((t, o["metadata"].get("name", ""))))
    ref = Reflector(
        "ModelCacheNode", server.list_fn, server.watch_fn, stop=server.stop,
        backoff=Backoff(0.001, 0.002), **kwargs,
    )  # fmt: skip
    ref.run()
    return ref, seen


def test_lists_then_watches_from_the_lists_version_and_keeps_the_store() -> None:
    server = FakeServer(
        [([obj("a", 5), obj("b", 6)], "10")],
        [[event("ADDED", obj("c", 11)), event("MODIFIED", obj("a", 12)), event("DELETED", obj("b", 13))]],
    )
    relisted: list[bool] = []
    ref, seen = run(server, on_relisted=lambda: relisted.append(True))
    assert seen == [("SYNC", "a"), ("SYNC", "b"), ("ADDED", "c"), ("MODIFIED", "a"), ("DELETED", "b")]
    assert server.watch_calls[0] == "10" and server.watch_calls[1] == "13"
    assert set(ref.items) == {("team-a", "a"), ("team-a", "c")}
    assert ref.items[("team-a", "a")]["metadata"]["resourceVersion"] == "12"
    assert ref.relists == 1 and relisted == [True] and ref.synced.is_set()


def test_bookmarks_move_the_position_and_a_dropped_watch_resumes_without_a_relist() -> None:
    server = FakeServer(
        [([], "10")],
        [[bookmark(20), Dropped("connection reset")], [event("ADDED", obj("a", 21))], Dropped("refused")],
    )
    ref, seen = run(server)
    assert seen == [("ADDED", "a")]  # a bookmark is no event for the callback
    assert server.watch_calls[:3] == ["10", "20", "21"]
    assert ref.relists == 1 and server.list_calls == 1


@pytest.mark.parametrize(
    "expiry",
    [
        Expired("HTTP 410 Gone"),  # at connect
        [status_error(410, "Expired", "too old resource version: 10 (15)")],  # as an ERROR event
        [status_error(500, "InternalError", "too old resource version: 10 (15)")],  # older servers
    ],
)
def test_expiry_relists_with_sync_and_deleted_for_what_vanished(expiry: Any) -> None:
    server = FakeServer(
        [([obj("a", 5), obj("b", 6)], "10"), ([obj("a", 16), obj("c", 17)], "18")],
        [expiry, [event("MODIFIED", obj("c", 19))]],
    )
    ref, seen = run(server)
    assert seen == [
        ("SYNC", "a"), ("SYNC", "b"),
        ("DELETED", "b"), ("SYNC", "a"), ("SYNC", "c"),  # after the relist: b vanished meanwhile
        ("MODIFIED", "c"),
    ]  # fmt: skip
    assert server.watch_calls[:2] == ["10", "18"] and ref.relists == 2
    assert set(ref.items) == {("team-a", "a"), ("team-a", "c")}
    assert ref.backoff.attempts == 0  # an expiry is no failure: relisted at once


def test_any_other_error_event_is_retried_from_the_same_position(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeServer(
        [([], "10")], [[status_error(500, "InternalError", "etcd leader changed")], [bookmark(11)]]
    )
    ref, _ = run(server)
    assert server.watch_calls[:2] == ["10", "10"] and ref.relists == 1
    assert "ModelCacheNode: watch failed; retrying" in caplog.text and "etcd leader changed" in caplog.text


def test_an_idle_watch_restarts_from_its_position_without_backoff_or_relist() -> None:
    server = FakeServer([([], "10")], [[event("ADDED", obj("a", 11)), Idle("quiet")], [bookmark(12)]])
    ref, _ = run(server)
    assert server.watch_calls[:2] == ["10", "11"] and ref.relists == 1 and ref.backoff.attempts == 0


def test_a_failed_callback_gets_its_event_again() -> None:
    failures = [RuntimeError("API hiccup")]
    seen: list[str] = []

    def on_event(type_: str, body: Obj) -> None:
        if type_ == "ADDED" and failures:
            raise failures.pop()
        seen.append(f"{type_} {body['metadata']['name']}")

    server = FakeServer(
        [([], "10")], [[event("ADDED", obj("a", 11))], [event("ADDED", obj("a", 11)), bookmark(12)]]
    )
    run(server, on_event=on_event)
    assert server.watch_calls[:2] == ["10", "10"]  # the failed event was not counted as seen
    assert seen == ["ADDED a"]


def test_a_watch_closed_at_once_without_an_event_backs_off() -> None:
    server = FakeServer([([], "10")], [[], []])
    ref, _ = run(server)
    assert server.watch_calls == ["10", "10", "10"] and ref.backoff.attempts == 2


def test_relist_every_relists_when_a_watch_ends_after_the_period() -> None:
    now = [0.0]
    server = FakeServer(
        [([obj("a", 1)], "2"), ([obj("b", 3)], "4")],
        [[event("ADDED", obj("c", 3))], [bookmark(3)]],
    )

    def clock() -> float:
        now[0] += 30  # every look at the clock is 30 s later
        return now[0]

    ref, seen = run(server, relist_every=100, clock=clock)
    assert ref.relists == server.list_calls == 2 and server.watch_calls == ["2", "3", "4"]
    assert seen == [("SYNC", "a"), ("ADDED", "c"), ("DELETED", "a"), ("DELETED", "c"), ("SYNC", "b")]


def test_a_list_without_a_resource_version_is_not_watched_from_now() -> None:
    server = FakeServer([([obj("a", 1)], ""), ([obj("a", 1)], "5")], [])
    run(server)
    assert server.list_calls == 2 and server.watch_calls == ["5"]


def test_staleness_counts_unanswered_time_and_clears_on_an_answer() -> None:
    now = [100.0]
    watches: list[str] = []
    stop = threading.Event()
    checks: list[tuple[float, bool]] = []

    def watch_fn(version: str) -> Iterator[Obj]:
        watches.append(version)
        if len(watches) < 3:
            now[0] += 40  # the server does not answer for 40 s, then refuses
            raise ConnectionRefusedError("refused")
        stop.set()
        return iter(())

    class Probe(Backoff):
        def next(self) -> float:
            checks.append((ref.unanswered_for(), ref.fresh(60)))
            return 0.0

    ref = Reflector("ModelCache", lambda: ([obj("a", 1)], "2"), watch_fn, stop=stop, backoff=Probe(),
                    clock=lambda: now[0])  # fmt: skip
    ref.run()
    assert checks == [(40.0, True), (80.0, False)]  # listed, then unanswered for too long
    assert ref.unanswered_for() == 0.0 and ref.fresh(60) and ref.last_error == ""


def test_stop_hangs_up_a_blocked_watch() -> None:
    gate = threading.Event()

    def watch_fn(version: str) -> Iterator[Obj]:
        def blocked() -> Iterator[Obj]:
            if gate.wait(DEADLINE):  # hang_up() shut the connection: the read ends with an error
                raise Dropped("hung up")
            yield bookmark(2)

        return blocked()

    ref = Reflector("Node", lambda: ([], "1"), watch_fn, hang_up=gate.set).start()
    assert ref.synced.wait(DEADLINE)
    started = time.monotonic()
    ref.stop(DEADLINE)
    assert ref._thread is not None and not ref._thread.is_alive()
    assert time.monotonic() - started < DEADLINE / 2
    assert ref.last_error == ""  # stopping is not reported as a failure


def test_backoff_is_capped_exponential_with_jitter() -> None:
    backoff = Backoff(1.0, 8.0)
    delays = [backoff.next() for _ in range(6)]
    for delay, full in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert full / 2 <= delay <= full
    backoff.reset()
    assert backoff.next() <= 1.0
    assert Backoff().initial == reflector.BACKOFF_INITIAL and Backoff().cap == reflector.BACKOFF_CAP


# ---- the edge: the real `kubernetes` client against the real API server ----------


def _node(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"pool": "a"}}}


def test_the_edge_lists_watches_goes_idle_and_expires(kube: RealKube) -> None:
    kube.create(_node("n1"))
    edge = ListWatch(client.CoreV1Api(kube.api_client()).list_node, watch_seconds=30, idle_seconds=0.5)
    items, version = edge.list()
    assert [i["metadata"]["name"] for i in items] == ["n1"] and version
    events = edge.watch(version)
    kube.create(_node("n2"))
    first = next(events)
    assert first["type"] == "ADDED" and first["object"]["metadata"]["name"] == "n2"
    with pytest.raises(Idle):  # nothing more within the read timeout
        next(events)
    events.close()  # type: ignore[attr-defined]
    kube.compact()
    stale = edge.watch(version)
    assert next(stale)["type"] == "ERROR"  # 410 in the stream, as the API server sends it
    stale.close()  # type: ignore[attr-defined]


def test_a_reflector_on_the_edge_follows_the_api_server_through_expiry_and_drops(kube: RealKube) -> None:
    kube.create(_node("n1"))
    edge = ListWatch(client.CoreV1Api(kube.api_client()).list_node, watch_seconds=30)
    seen: list[tuple[str, str]] = []
    ref = Reflector(
        "Node", edge.list, edge.watch, hang_up=edge.hang_up, backoff=Backoff(0.01, 0.05),
        on_event=lambda t, o: seen.append((t, o["metadata"]["name"])),
    ).start()  # fmt: skip
    try:
        kube.wait_for_watches(1)
        kube.create(_node("n2"))
        wait_for("an added Node", lambda: ("", "n2") in ref.items, DEADLINE, interval=0.01)
        kube.drop_watches()
        kube.delete("nodes", "n1")
        wait_for("a deletion during the drop", lambda: ("DELETED", "n1") in seen, DEADLINE, interval=0.01)
        assert ref.relists == 1  # resumed, not relisted
        kube.wait_for_watches(1)
        kube.expire_watches()
        wait_for("a relist after 410", lambda: ref.relists == 2, DEADLINE, interval=0.01)
        kube.create(_node("n3"))
        wait_for("an event after the relist", lambda: ("", "n3") in ref.items, DEADLINE, interval=0.01)
    finally:
        ref.stop()
    assert ref._thread is not None and not ref._thread.is_alive()
