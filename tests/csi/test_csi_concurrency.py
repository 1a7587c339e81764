"""Many kubelet workers at once: same target, different targets, racing volumes."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from praesto.csi import mounts

from praesto import store
from testkit.csi_driver import NEEDS_ROOT, InProcessDriver, make_cache, publish_request

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)
THREADS = 16


def outcome(call: object) -> grpc.StatusCode:
    assert callable(call)
    try:
        call()
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def run_all(calls: list[object]) -> list[grpc.StatusCode]:
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(outcome, calls))


def test_same_publish_from_many_threads_mounts_once(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "default", "tinyllama")
    target = str(pods / "t")
    request = publish_request("csi-1", target)
    assert run_all([lambda: driver.client.publish(request)] * THREADS) == [grpc.StatusCode.OK] * THREADS
    assert len(mounts.mounts_at(mounts.read_mountinfo(), target)) == 1
    assert [r.volume_id for r in store.all_mounts(driver.layout)] == ["csi-1"]
    assert (
        run_all([lambda: driver.client.unpublish("csi-1", target)] * THREADS)
        == [grpc.StatusCode.OK] * THREADS
    )
    assert mounts.mounts_at(mounts.read_mountinfo(), target) == []
    assert store.all_mounts(driver.layout) == []


def test_different_targets_in_parallel(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "default", "tinyllama")
    make_cache(driver.layout, "default", "bert")
    jobs = [
        (f"csi-{i}", str(pods / f"pod-{i}" / "mount"), "tinyllama" if i % 2 else "bert")
        for i in range(THREADS)
    ]
    calls: list[object] = [lambda j=j: driver.client.publish(publish_request(j[0], j[1], j[2])) for j in jobs]
    assert run_all(calls) == [grpc.StatusCode.OK] * THREADS
    table = mounts.read_mountinfo()
    for _, target, cache in jobs:
        (entry,) = mounts.mounts_at(table, target)
        assert entry.read_only
        assert Path(target, "config.json").read_text() == json.dumps({"model": cache})
    assert len(store.mounts_for(driver.layout, "default", "bert")) == THREADS // 2
    calls = [lambda j=j: driver.client.unpublish(j[0], j[1]) for j in jobs]
    assert run_all(calls) == [grpc.StatusCode.OK] * THREADS
    assert [e for e in mounts.read_mountinfo() if mounts.is_within(e.mount_point, str(pods))] == []
    assert store.all_mounts(driver.layout) == []


def test_racing_volumes_for_one_target_one_wins(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "default", "tinyllama")
    target = str(pods / "t")
    calls: list[object] = [
        lambda i=i: driver.client.publish(publish_request(f"csi-{i}", target)) for i in range(THREADS)
    ]
    results = run_all(calls)
    assert results.count(grpc.StatusCode.OK) == 1
    assert results.count(grpc.StatusCode.ALREADY_EXISTS) == THREADS - 1
    assert len(mounts.mounts_at(mounts.read_mountinfo(), target)) == 1
    (record,) = store.all_mounts(driver.layout)
    assert record.volume_id == f"csi-{results.index(grpc.StatusCode.OK)}"
