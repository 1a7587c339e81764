"""What the scale tier samples of the Metacontroller stand-in (bench/scale_standin.py): how many
watch events an informer holds that its cache has not applied yet, and how old the oldest is; how
many keys wait in a controller's work queue."""

from __future__ import annotations

import threading
import time

from kubernetes import client

from testkit.informer import Informer
from testkit.workqueue import WorkQueue


def test_an_informers_backlog_counts_events_not_applied_and_ages_the_oldest() -> None:
    informer = Informer(client.ApiClient(), "v1", "nodes", "Node", lag=0.0)  # not started: nothing applies
    assert informer.backlog() == (0, 0.0)
    for name in ("a", "b", "c"):
        informer._push("ADDED", {"metadata": {"name": name}})
    deadline = time.monotonic() + 5
    while informer.backlog()[1] <= 0 and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    count, age = informer.backlog()
    assert count == 3 and 0 < age < 5


def test_a_work_queues_depth_is_the_keys_waiting_for_a_worker() -> None:
    queue = WorkQueue()
    assert queue.depth() == 0
    queue.add("team-a/m", "test")
    queue.add("team-a/m", "test")  # the same key queued once
    queue.add("team-b/m", "test")
    assert queue.depth() == 2
