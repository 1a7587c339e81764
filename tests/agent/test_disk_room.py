"""The disk room on its own: no API server, no agent, only a store on disk and the copies it knows.

`DiskRoom` decides from the disk and `Copies` alone which copies may give room, evicts
them with the store's protocol and tells its caller (`on_evicted`); the agent tests
(test_agent_eviction.py, test_agent_fairness.py) check the same through the whole agent.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from praesto.agent.copies import CacheRef, Copies
from praesto.agent.download import api as dlapi
from praesto.agent.room import DiskRoom
from praesto.csi.storefs import CsiStore

from praesto import names, store
from praesto.quota import Quotas
from praesto.spec import parse_uri

KiB = 1024
NS = "team-a"


def _copy(layout: store.StoreLayout, copies: Copies, cache: str, size: int, *, namespace: str = NS,
          used: float | None = None) -> None:  # fmt: skip
    """A complete copy on disk (as publish leaves it) and its ModelCacheNode in the agent's view."""
    folder = layout.cache_dir(namespace, cache)
    folder.mkdir(parents=True)
    (folder / "w.bin").write_bytes(os.urandom(size))
    (folder / names.MANIFEST_FILE).write_text(json.dumps({"totalBytes": size}))
    layout.complete_marker(namespace, cache).write_text("{}")
    if used is not None:
        os.utime(layout.complete_marker(namespace, cache), (used, used))
        CsiStore(layout).touch_used(namespace, cache, used)
    name = f"{cache}-node-a"
    copies.objects[(namespace, name)] = {
        "metadata": {"namespace": namespace, "name": name, "resourceVersion": "1"},
        "spec": {"modelCacheName": cache},
    }


def _plan(cache: str, size: int) -> tuple[CacheRef, dlapi.Plan]:
    source, errors = parse_uri(f"hf://org/{cache}", "source")
    assert source is not None and not errors
    plan = dlapi.Plan(source, "0" * 40, (dlapi.RemoteFile("w.bin", size, sha256="0" * 64),))
    return CacheRef(NS, f"{cache}-node-a", cache, source, None, None), plan


class Running:
    cancel = threading.Event()


def test_candidates_are_complete_unmounted_idle_copies_and_over_quota_namespaces_come_first(
    tmp_path: Path,
) -> None:
    layout, copies = store.StoreLayout(tmp_path), Copies()
    now = time.time()
    for cache in ("asking", "idle", "mounted", "running", "deleting"):
        _copy(layout, copies, cache, 4 * KiB, used=now - 100)
    _copy(layout, copies, "greedy", 8 * KiB, namespace="team-b", used=now)  # newest, but over quota
    CsiStore(layout).record_mount(store.MountRecord("vol-1", NS, "mounted", "/var/lib/kubelet/x", now))
    copies.state((NS, "running-node-a")).job = Running()
    copies.objects[(NS, "deleting-node-a")]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    room = DiskRoom(layout, copies, "0", Quotas(namespaces={"team-b": 4 * KiB}))

    ref, _ = _plan("asking", 4 * KiB)
    candidates = room.candidates(ref)
    assert [(c.namespace, c.name, c.over_quota) for c in candidates] in (
        [("team-a", "idle", False), ("team-b", "greedy", True)],
        [("team-b", "greedy", True), ("team-a", "idle", False)],
    )
    on_disk = {c: sum(f.stat().st_size for f in layout.cache_dir(n, c).iterdir()) for n, c in (
        (NS, "idle"), ("team-b", "greedy"))}  # fmt: skip
    assert {c.name: c.size for c in candidates} == on_disk  # what evicting it gives back
    assert room.usage() == {"team-a": 5 * 4 * KiB, "team-b": 8 * KiB}


@pytest.mark.root
def test_room_is_made_by_evicting_the_least_recently_used_and_promised_until_released(
    small_disk: Path,
) -> None:
    layout, copies = store.StoreLayout(small_disk), Copies()
    now = time.time()
    _copy(layout, copies, "old", 350 * KiB, used=now - 7200)
    _copy(layout, copies, "recent", 350 * KiB, used=now - 60)
    CsiStore(layout).record_mount(store.MountRecord("vol-1", NS, "recent", "/var/lib/kubelet/x", now))
    evicted: list[tuple[str, str, str]] = []
    room = DiskRoom(layout, copies, "100Ki", on_evicted=lambda *told: evicted.append(told))

    ref, plan = _plan("new", 350 * KiB)
    assert room.make_room(ref, plan) == [(NS, "old")]
    assert evicted == [(NS, "old", "capacity")]
    assert not layout.cache_dir(NS, "old").exists() and layout.is_complete(NS, "recent")
    assert copies.state((NS, "old-node-a")).evicted  # no reconcile downloads it back meanwhile
    assert room.reservations.held == {(NS, "new"): 350 * KiB}

    second, second_plan = _plan("second", 350 * KiB)
    with pytest.raises(dlapi.DownloadError) as refused:  # the first's promise counts as spent
        room.make_room(second, second_plan)
    assert refused.value.reason == "InsufficientDiskSpace"
    assert "promised to downloads in flight" in refused.value.message
    assert layout.is_complete(NS, "recent")  # mounted: never evicted

    room.release((NS, "new"))
    assert room.reservations.held == {}
