"""Deleting a cache while a Pod mounts it, in both orders (stuck-state finding 4, reproduced by ordering).

The agent's deletion once checked mount records and then removed the tree, so a
mount starting in between got an empty directory. Now both sides follow one
protocol: the agent takes the marker away, then checks the records (restoring the
marker if a mount exists); the CSI plugin records its mount, then looks for the
marker again. Whatever the interleaving, a Pod gets the whole model or a
retryable refusal, never an empty mount.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from praesto.agent import eviction
from praesto.csi.storefs import CsiStore

from praesto import names, store
from testkit.csi_driver import NEEDS_ROOT, InProcessDriver, make_cache, mounts_under, publish_request

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)
NS, CACHE = "default", "tinyllama"


def test_removal_between_the_marker_check_and_the_record_refuses_the_mount(
    driver: InProcessDriver, layout: store.StoreLayout, pods: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_cache(layout, NS, CACHE)
    record = CsiStore.record_mount
    removed: list[bool] = []

    def agent_deletes_first(*args: Any, **kwargs: Any) -> None:
        # The node agent's whole deletion runs right here, after the plugin saw the marker.
        removed.append(eviction.remove_unless_mounted(layout, NS, CACHE))
        record(*args, **kwargs)

    monkeypatch.setattr(CsiStore, "record_mount", agent_deletes_first)
    target = pods / "pod-1" / "models"
    with pytest.raises(grpc.RpcError) as err:
        driver.client.publish(publish_request("vol-1", str(target)))
    assert removed == [True]
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert mounts_under(pods) == []
    assert store.mounts_for(layout, NS, CACHE) == []  # the refused mount left no record behind


def test_a_mount_that_starts_while_the_agent_checks_gets_the_whole_model_or_a_refusal(
    driver: InProcessDriver, layout: store.StoreLayout, pods: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old failure: the agent found no mount record, a Pod mounted the complete cache, then the
    agent removed the tree under the Pod's bind mount."""
    make_cache(layout, NS, CACHE)
    check = store.mounts_for
    target = pods / "pod-3" / "models"
    outcome: list[grpc.StatusCode] = []

    def a_pod_mounts_meanwhile(*args: Any, **kwargs: Any) -> list[store.MountRecord]:
        found = check(*args, **kwargs)
        if not outcome:  # the whole NodePublishVolume runs between the agent's check and its removal
            try:
                driver.client.publish(publish_request("vol-3", str(target)))
                outcome.append(grpc.StatusCode.OK)
            except grpc.RpcError as err:
                outcome.append(err.code())
        return found

    monkeypatch.setattr(store, "mounts_for", a_pod_mounts_meanwhile)
    eviction.remove_unless_mounted(layout, NS, CACHE)
    if outcome == [grpc.StatusCode.OK]:
        assert (target / "model.safetensors").read_text() == "weights"  # never an emptied mount
    else:
        assert outcome == [grpc.StatusCode.UNAVAILABLE] and mounts_under(pods) == []


def test_a_recorded_mount_keeps_the_cache_whole(
    driver: InProcessDriver, layout: store.StoreLayout, pods: Path
) -> None:
    make_cache(layout, NS, CACHE)
    target = pods / "pod-2" / "models"
    driver.client.publish(publish_request("vol-2", str(target)))
    assert eviction.remove_unless_mounted(layout, NS, CACHE) is False
    assert layout.is_complete(NS, CACHE)
    assert (target / "model.safetensors").read_text() == "weights"
    assert (target / names.COMPLETE_FILE).exists()
