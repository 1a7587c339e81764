"""Eviction by unusedTTL and for room, never of a mounted cache, and rehydration on request."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent import eviction
from praesto.csi.storefs import CsiStore

from praesto import names, store
from praesto.quantity import format_bytes
from testkit.agent_harness import Env, env_context, ready_condition, tree
from testkit.kube_real import RealKube

SMALL = b'{"model_type": "tiny"}'
KiB = 1024


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def _mount(env: Env, cache: str, volume: str) -> None:
    """A mount record exactly as the CSI driver writes it."""
    target = f"/var/lib/kubelet/pods/{volume}/volumes/x"
    CsiStore(env.layout).record_mount(store.MountRecord(volume, "team-a", cache, target, time.time()))


def test_ttl_eviction_then_hydration_request_brings_it_back(env: Env) -> None:
    weights = os.urandom(4 * KiB)
    env.add_model("idle", **{"config.json": SMALL, "w.bin": weights})
    env.add_model("busy", **{"config.json": SMALL})
    env.create_mcn("idle", ttl="10m")
    env.create_mcn("busy", ttl="10m")
    env.start()
    env.wait_phase("idle", names.PHASE_READY)
    env.wait_phase("busy", names.PHASE_READY)
    _mount(env, "busy", "vol-1")
    CsiStore(env.layout).touch_used("team-a", "idle")  # used once, unmounted now
    env.wait(lambda: "lastUsedTime" in env.status("idle"), "lastUsedTime of the unmounted cache")

    env.skip(11 * 60)  # the agent's clock moves past the TTL
    status = env.wait_phase("idle", names.PHASE_EVICTED)
    assert ready_condition(status)["reason"] == "Evicted"
    assert "unusedTTL" in status["message"]
    assert not env.layout.cache_dir("team-a", "idle").exists()
    assert env.metric("praesto_agent_evictions_total", cause="ttl") == 1
    assert env.status("busy")["phase"] == names.PHASE_READY  # mounted: never evicted
    assert env.layout.is_complete("team-a", "busy")
    blobs = list(env.layout.blobs_dir.iterdir()) if env.layout.blobs_dir.is_dir() else []
    assert all(b.stat().st_nlink > 1 for b in blobs)  # the evicted cache's blobs were collected
    progress = store.read_progress(env.layout, "team-a", "idle")
    assert progress is not None and progress.phase == names.PHASE_EVICTED

    env.offset = 0.0
    env.hub.reset_counters()
    CsiStore(env.layout).request_hydration("team-a", "idle")  # what the CSI driver does on a mount
    env.wait_phase("idle", names.PHASE_READY)
    assert tree(env.layout.cache_dir("team-a", "idle"))["w.bin"] == weights
    assert env.hub.bytes_served >= len(weights)
    env.wait(lambda: store.pending_hydration_requests(env.layout) == [], "hydration request cleared")


def test_hydration_request_for_a_ready_cache_is_just_cleared(env: Env) -> None:
    env.add_model("tiny", **{"config.json": SMALL})
    env.create_mcn("tiny")
    env.start()
    env.wait_phase("tiny", names.PHASE_READY)
    env.hub.reset_counters()
    CsiStore(env.layout).request_hydration("team-a", "tiny")
    env.wait(lambda: store.pending_hydration_requests(env.layout) == [], "request cleared")
    assert env.hub.bytes_served == 0


def test_mounted_cache_reports_now_as_last_used(env: Env) -> None:
    env.add_model("tiny", **{"config.json": SMALL})
    env.create_mcn("tiny", ttl="1s")
    env.start()
    env.wait_phase("tiny", names.PHASE_READY)
    _mount(env, "tiny", "vol-1")
    env.skip(3600)
    env.wait(lambda: "lastUsedTime" in env.status("tiny"), "lastUsedTime while mounted")
    assert env.status("tiny")["phase"] == names.PHASE_READY
    stamp = env.status("tiny")["lastUsedTime"]
    assert stamp >= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(env.clock() - 60))


@pytest.mark.root
def test_capacity_evicts_the_least_recently_used_unmounted_cache(
    tmp_path: Path, kube: RealKube, small_disk: Path
) -> None:
    for env in env_context(kube, tmp_path, small_disk):
        sizes = {"old": 350 * KiB, "recent": 350 * KiB, "new": 350 * KiB}
        for cache, size in sizes.items():
            env.add_model(cache, **{"w.bin": os.urandom(size)})
        env.create_mcn("old")
        env.create_mcn("recent")
        env.start()
        env.wait_phase("old", names.PHASE_READY)
        env.wait_phase("recent", names.PHASE_READY)
        now = time.time()
        CsiStore(env.layout).touch_used("team-a", "old", now - 7200)
        CsiStore(env.layout).touch_used("team-a", "recent", now - 3600)
        os.utime(env.layout.complete_marker("team-a", "old"), (now - 9000, now - 9000))
        os.utime(env.layout.complete_marker("team-a", "recent"), (now - 9000, now - 9000))
        _mount(env, "old", "vol-old")  # least recently used, but in use: must stay

        env.create_mcn("new")
        env.wait_phase("new", names.PHASE_READY)
        assert env.wait_phase("recent", names.PHASE_EVICTED)["message"].startswith("evicted")
        assert env.status("old")["phase"] == names.PHASE_READY
        assert env.layout.is_complete("team-a", "old")
        assert env.metric("praesto_agent_evictions_total", cause="capacity") == 1


@pytest.mark.root
def test_insufficient_disk_space_names_the_numbers_and_evicts_nothing(
    tmp_path: Path, kube: RealKube, small_disk: Path
) -> None:
    for env in env_context(kube, tmp_path, small_disk):
        env.add_model("fits", **{"w.bin": os.urandom(200 * KiB)})
        env.add_model("huge", **{"w.bin": os.urandom(2048 * KiB)})
        env.create_mcn("fits")
        env.start(reserve="100Ki")
        env.wait_phase("fits", names.PHASE_READY)
        env.create_mcn("huge")
        status = env.wait_reason("huge", "InsufficientDiskSpace")
        assert status["phase"] == names.PHASE_FAILED
        message = status["message"]
        assert "needs 2.0 MiB" in message and "reserve of 100.0 KiB" in message and "disk 1.0 MiB" in message
        freeable = format_bytes(eviction.freeable_bytes(env.layout, "team-a", "fits"))
        assert f"would free only {freeable}" in message
        assert env.layout.is_complete("team-a", "fits")  # nothing evicted for a hopeless case
        assert not any(env.layout.internal.glob("staging/*/**/w.bin"))
        assert env.metric("praesto_agent_download_failures_total", reason="InsufficientDiskSpace") >= 1


def test_removal_and_request_cleanup_never_go_through_a_symlink(tmp_path: Path) -> None:
    """Eviction reaches the store through the fd-safe walk (praesto.csi.storefs): a link planted
    for a namespace or for the driver's requests directory is refused, and nothing behind it goes."""
    layout = store.StoreLayout(tmp_path / "base")
    outside = tmp_path / "outside"
    (outside / "llm").mkdir(parents=True)
    (outside / "llm" / "keep.bin").write_text("x")
    (outside / "team-b_gone.json").write_text('{"namespace": "team-b", "name": "gone"}')
    layout.internal.mkdir(parents=True)
    (layout.base / "team-a").symlink_to(outside)
    layout.requests_dir.symlink_to(outside)

    with pytest.raises(eviction.UnsafePath, match="symlink"):
        eviction.remove_all(layout, "team-a", "llm")
    assert eviction.drop_unowned_requests(layout, set()) == 0
    assert sorted(p.name for p in outside.rglob("*")) == ["keep.bin", "llm", "team-b_gone.json"]
