"""On start and after every relist the agent removes copies no ModelCacheNode of its node owns.

A node that was unreachable while its ModelCacheNodes were released (the Node was
deleted, or the copies were removed by hand) comes back with those directories on
disk; nothing else would ever remove them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.csi.storefs import CsiStore

from praesto import names, store
from testkit.agent_harness import MCN, Env, env_context
from testkit.csi_driver import make_cache
from testkit.kube_real import RealKube


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def test_unowned_copies_go_owned_and_mounted_ones_stay(env: Env) -> None:
    env.add_model("kept", **{"config.json": b"{}"})
    env.create_mcn("kept")
    make_cache(env.layout, "team-a", "ghost")  # left behind: no ModelCacheNode owns it
    make_cache(env.layout, "team-b", "in-use")  # unowned too, but a Pod still mounts it
    record = store.MountRecord("vol-1", "team-b", "in-use", "/var/lib/kubelet/pods/p/volumes/x", time.time())
    CsiStore(env.layout).record_mount(record)
    env.start()
    env.wait_phase("kept", names.PHASE_READY)
    env.wait(lambda: not env.layout.cache_dir("team-a", "ghost").exists(), "the unowned copy to go")
    assert env.layout.is_complete("team-a", "kept")
    assert env.layout.is_complete("team-b", "in-use")  # removal never pulls a mounted copy away


def test_a_node_that_was_away_cleans_up_when_its_agent_returns(env: Env) -> None:
    env.add_model("released", **{"config.json": b"{}"})
    env.create_mcn("released")
    agent = env.start()
    env.wait_phase("released", names.PHASE_READY)
    agent.stop()  # the node is unreachable ...
    obj = env.get("released")
    assert obj is not None
    name = obj["metadata"]["name"]
    env.kube.patch(MCN, name, {"metadata": {"finalizers": []}}, "team-a")  # ... and its copy is released
    env.kube.delete(MCN, name, "team-a")
    assert env.layout.is_complete("team-a", "released")
    env.start()  # the node is back: its first list no longer has the copy
    env.wait(lambda: not env.layout.cache_dir("team-a", "released").exists(), "the released copy to go")
