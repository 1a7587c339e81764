"""A cache that is not on the node: the agent is asked through its channel, the kubelet told why it waits."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from praesto import names, store
from testkit.csi_driver import NEEDS_ROOT, InProcessDriver, make_cache, publish_request, rpc_error

GiB = 1024**3


def test_missing_cache_requests_hydration_and_waits(driver: InProcessDriver, pods: Path) -> None:
    request = publish_request("csi-1", str(pods / "t"))
    err = rpc_error(lambda: driver.client.publish(request))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert err.details() == (
        "model cache default/tinyllama is not on node n1 yet: waiting for the node agent to start downloading it"
    )
    assert store.pending_hydration_requests(driver.layout) == [("default", "tinyllama")]
    assert store.all_mounts(driver.layout) == []
    assert not (pods / "t").exists()


def test_incomplete_cache_shows_agent_progress(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "default", "tinyllama", complete=False)
    total = int(4.1 * GiB)
    store.write_progress(
        driver.layout,
        "default",
        "tinyllama",
        store.Progress(names.PHASE_DOWNLOADING, int(total * 0.415), total),
    )
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"))))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert err.details() == "model cache default/tinyllama is downloading on node n1: 41% of 4.1 GiB"
    assert store.pending_hydration_requests(driver.layout) == [("default", "tinyllama")]


def test_evicted_cache_is_rehydrated(driver: InProcessDriver, pods: Path) -> None:
    store.write_progress(driver.layout, "default", "tinyllama", store.Progress(names.PHASE_EVICTED))
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"))))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "evicted" in (err.details() or "")
    assert store.pending_hydration_requests(driver.layout) == [("default", "tinyllama")]


def test_failed_download_is_failed_precondition_with_reason(driver: InProcessDriver, pods: Path) -> None:
    store.write_progress(
        driver.layout,
        "default",
        "tinyllama",
        store.Progress(names.PHASE_FAILED, message="401 Unauthorized: the token cannot read org/tinyllama"),
    )
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"))))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "401 Unauthorized: the token cannot read org/tinyllama" in (err.details() or "")


def test_unanswered_request_says_cache_is_not_assigned(base: Path, pods: Path) -> None:
    with InProcessDriver(base, unassigned_after=0.0) as driver:
        err = rpc_error(
            lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"), "llm", "team-a"))
        )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.details() or ""
    assert details.startswith("model cache team-a/llm is not assigned to node n1")
    assert names.MODELCACHENODE_KIND in details and "nodeSelector" in details


@pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)
def test_publish_succeeds_once_the_agent_completes(driver: InProcessDriver, pods: Path) -> None:
    request = publish_request("csi-1", str(pods / "t"))
    assert rpc_error(lambda: driver.client.publish(request)).code() == grpc.StatusCode.UNAVAILABLE
    # the agent's side: take the request, publish the cache, clear the request
    assert store.pending_hydration_requests(driver.layout) == [("default", "tinyllama")]
    make_cache(driver.layout, "default", "tinyllama")
    store.clear_hydration_request(driver.layout, "default", "tinyllama")
    driver.client.publish(request)
    assert (pods / "t" / "model.safetensors").read_text() == "weights"
    assert store.pending_hydration_requests(driver.layout) == []
