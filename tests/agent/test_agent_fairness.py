"""Fair disk on a node: storage.size is a limit, plans reserve their bytes, over-quota namespaces give first.

Issue #12 (7). Each test reproduces what a tenant could do before: cache a model
larger than it declared, race a second download into the reserve, or have its
caches pushed off a node by a namespace that holds more than its quota.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent import capacity
from praesto.agent.copies import CacheRef, Copies
from praesto.agent.download import api as dlapi
from praesto.agent.reservations import Reservations
from praesto.agent.room import DiskRoom
from praesto.csi.storefs import CsiStore

from praesto import names, store
from praesto.quantity import format_bytes
from praesto.quota import Quotas
from praesto.spec import parse_uri
from testkit.agent_harness import MCN, Env, env_context, ready_condition
from testkit.kube_real import RealKube

KiB = 1024
SMALL = b'{"model_type": "tiny"}'


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


# ---- storage.size is a limit in node mode ------------------------------------------------------


def test_a_model_larger_than_storage_size_is_refused_before_writing(env: Env) -> None:
    weights = os.urandom(5000)
    env.add_model("big", **{"config.json": SMALL, "w.bin": weights})
    env.create_mcn("big", size="1Ki")
    env.start()
    status = env.wait_reason("big", "SizeExceedsRequest")
    assert status["phase"] == names.PHASE_FAILED
    total = len(SMALL) + len(weights)
    message = status["message"]
    assert f"the model is {format_bytes(total)} ({total} bytes)" in message
    assert "spec.storage.size 1.0 KiB (1024 bytes)" in message
    assert "raise storage.size" in message and "nothing was written" in message
    assert env.hub.bytes_by_path.get("w.bin", 0) == 0  # not one byte of the model fetched
    assert not env.layout.cache_dir("team-a", "big").exists()
    assert not env.layout.staging_dir("team-a", "big").exists()


def test_a_copy_already_larger_than_the_limit_is_served_and_says_so(env: Env) -> None:
    env.add_model("prebaked", **{"config.json": SMALL, "w.bin": os.urandom(5000)})
    env.create_mcn("prebaked", size="1Mi")
    agent = env.start()
    env.wait_phase("prebaked", names.PHASE_READY)
    agent.stop()
    obj = env.get("prebaked")
    assert obj is not None
    env.kube.patch(MCN, obj["metadata"]["name"], {"spec": {"size": "1Ki"}}, "team-a")
    env.start()
    env.wait(
        lambda: any(
            c["type"] == "SizeWithinRequest" and c["status"] == "False"
            for c in env.status("prebaked")["conditions"]
        ),
        "the size condition to turn False",
    )
    status = env.status("prebaked")
    assert status["phase"] == names.PHASE_READY
    size = next(c for c in status["conditions"] if c["type"] == "SizeWithinRequest")
    assert size["reason"] == "SizeExceedsRequest" and "already complete here" in size["message"]


# ---- reservations: two plans cannot both spend the same free bytes --------------------------------


def _plan(repo: str, size: int) -> dlapi.Plan:
    source, errors = parse_uri(f"hf://{repo}", "source")
    assert source is not None and not errors
    return dlapi.Plan(source, "0" * 40, (dlapi.RemoteFile("w.bin", size, sha256="0" * 64),))


def _ref(cache: str, size: int) -> CacheRef:
    return CacheRef("team-a", f"{cache}-node-a", cache, _plan(f"org/{cache}", size).source, None, None)


@pytest.mark.root
def test_two_plans_in_flight_cannot_both_eat_into_the_reserve(small_disk: Path) -> None:
    """Free space is read at plan time, bytes land later: the second plan must count the first's."""
    layout = store.StoreLayout(small_disk)
    room = DiskRoom(layout, Copies(), "100Ki")  # no other copy on the node: nothing to evict
    free = capacity.disk_usage(small_disk).free
    size = (free - 100 * KiB) * 3 // 4  # each fits alone above the reserve, both together do not
    assert room.make_room(_ref("first", size), _plan("org/first", size)) == []
    with pytest.raises(dlapi.DownloadError) as refused:
        room.make_room(_ref("second", size), _plan("org/second", size))
    assert refused.value.reason == "InsufficientDiskSpace"
    assert f"({format_bytes(size)} of it promised to downloads in flight)" in refused.value.message

    with room.lock:  # what the first job does however it ends
        room.reservations.release(("team-a", "first"))
    assert room.make_room(_ref("second", size), _plan("org/second", size)) == []


def test_written_bytes_stop_counting_as_promised() -> None:
    ledger = Reservations()
    ledger.reserve(("a", "x"), 100)
    ledger.reserve(("a", "y"), 50)
    written = {("a", "x"): 30, ("a", "y"): 80}
    assert ledger.outstanding(lambda k: written[k]) == 70  # y wrote more than it promised: 0, never less
    assert ledger.outstanding(lambda k: written[k], excluding=("a", "x")) == 0
    ledger.release(("a", "x"))
    assert ledger.held == {("a", "y"): 50}


@pytest.mark.root
def test_a_failed_download_gives_its_reservation_back(
    tmp_path: Path, kube: RealKube, small_disk: Path
) -> None:
    for env in env_context(kube, tmp_path, small_disk):
        env.add_model("broken", **{"w.bin": os.urandom(450 * KiB)})
        env.add_model("next", **{"w.bin": os.urandom(450 * KiB)})
        env.hub.faults.corrupt["w.bin"] = 1000  # every response for it: ChecksumMismatch after the plan
        env.create_mcn("broken")
        env.start(reserve="100Ki")
        env.wait_reason("broken", "ChecksumMismatch")
        obj = env.get("broken")
        assert obj is not None
        env.kube.delete(MCN, obj["metadata"]["name"], "team-a")  # its staging goes with it
        env.wait(lambda e=env: e.get("broken") is None, "the failed copy to be finalized")  # type: ignore[misc]
        env.hub.faults.corrupt.clear()
        env.create_mcn("next")
        env.wait_phase("next", names.PHASE_READY)


# ---- quota: over-quota namespaces give room first, in-use caches never ---------------------------


def _mount(env: Env, namespace: str, cache: str, volume: str) -> None:
    target = f"/var/lib/kubelet/pods/{volume}/volumes/x"
    CsiStore(env.layout).record_mount(store.MountRecord(volume, namespace, cache, target, time.time()))


@pytest.mark.root
def test_eviction_takes_from_the_namespace_over_its_quota_first(
    tmp_path: Path, kube: RealKube, small_disk: Path
) -> None:
    for env in env_context(kube, tmp_path, small_disk):
        for cache in ("quiet", "greedy", "busy", "new"):
            env.add_model(cache, **{"w.bin": os.urandom(300 * KiB)})
        env.create_mcn("quiet", namespace="team-b")  # within its quota, least recently used
        env.create_mcn("greedy", namespace="team-a")  # team-a may hold 100Ki, holds 600Ki
        env.create_mcn("busy", namespace="team-a")  # over quota too, but a Pod uses it
        env.start(quotas=Quotas(default=None, namespaces={"team-a": 100 * KiB}))
        for cache, namespace in (("quiet", "team-b"), ("greedy", "team-a"), ("busy", "team-a")):
            env.wait_phase(cache, names.PHASE_READY, namespace)
        now = time.time()
        for cache, namespace, used in (
            ("quiet", "team-b", 7200),
            ("greedy", "team-a", 60),
            ("busy", "team-a", 1),
        ):
            CsiStore(env.layout).touch_used(namespace, cache, now - used)
            os.utime(env.layout.complete_marker(namespace, cache), (now - 9000, now - 9000))
        _mount(env, "team-a", "busy", "vol-busy")

        env.create_mcn("new", namespace="team-c")
        env.wait_phase("new", names.PHASE_READY, "team-c")
        assert env.status("greedy", "team-a")["phase"] == names.PHASE_EVICTED
        assert env.layout.is_complete("team-b", "quiet")  # older, but its namespace is within quota
        assert env.layout.is_complete("team-a", "busy")  # in use: never evicted
        assert ready_condition(env.status("quiet", "team-b"))["reason"] == "Cached"


def test_over_quota_candidates_come_first_then_least_recently_used() -> None:
    disk = capacity.Disk(total=100, free=0)
    fair_old = capacity.Candidate("b", "old", 30, last_used=1.0)
    greedy_new = capacity.Candidate("a", "new", 30, last_used=5.0, over_quota=True)
    greedy_mid = capacity.Candidate("a", "mid", 30, last_used=3.0, over_quota=True)
    assert capacity.choose_evictions(30, disk, 0, [fair_old, greedy_new, greedy_mid]) == [greedy_mid]
    assert capacity.choose_evictions(70, disk, 0, [fair_old, greedy_new, greedy_mid]) == [
        greedy_mid,
        greedy_new,
        fair_old,
    ]
    assert capacity.over_quota({"a": 60, "b": 30, "c": 999}, {"a": 50, "b": 50}.get) == {"a"}
