"""Rolling revision updates on one node (agent/rolling.py), against the real API server and the local hub.

A ModelCacheNode asked for another revision of its source: the new one is fetched beside the
served copy (only changed bytes from the origin), switched onto the cache directory, the old
one kept while a mount record names its commit and removed after; a rollback fetches nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.csi.storefs import CsiStore

from praesto import names, store
from testkit.agent_harness import MCN, Env, env_context, tree
from testkit.kube_real import RealKube

SHARED = os.urandom(6000)  # LFS-sized: known by sha256 before download, so linked from the blob
OLD, NEW = os.urandom(5000), os.urandom(7000)
REPO = "org/roll"
NODE_OBJ = names.modelcachenode_name("roll", "node-a")


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def _ask(env: Env, revision: str, switch: bool | None = None) -> None:
    spec: dict[str, object] = {"source": {"revision": revision}}
    if switch is not None:
        spec["switch"] = switch
    env.kube.patch(MCN, NODE_OBJ, {"spec": spec}, "team-a")


def _served(env: Env) -> str:
    return str((store.read_json(env.layout.manifest_path("team-a", "roll")) or {}).get("resolvedRevision"))


def _ready_at(env: Env, revision: str) -> bool:
    status = env.status("roll")
    return status.get("phase") == names.PHASE_READY and status.get("resolvedRevision") == revision


def _two_revisions(env: Env) -> tuple[str, str]:
    first = env.hub.add_repo(REPO, {"shared.bin": SHARED, "weights.bin": OLD})
    second = env.hub.commit(REPO, {"shared.bin": SHARED, "weights.bin": NEW}, branch="v2")
    env.create_mcn("roll")
    _ask(env, first)
    return first, second


def test_a_new_revision_is_fetched_beside_switched_and_the_old_one_goes_after_its_last_mount(
    env: Env,
) -> None:
    first, second = _two_revisions(env)
    env.start()
    env.wait(lambda: _ready_at(env, first), "the first revision served")
    record = store.MountRecord("vol-old", "team-a", "roll", "/pods/old/volumes/m", time.time(), first)
    CsiStore(env.layout).record_mount(record)  # a Pod reads the first revision
    env.hub.reset_counters()

    _ask(env, "v2")  # a branch: the node resolves it
    env.wait(lambda: _ready_at(env, second), "the switch", timeout=60)
    assert env.hub.bytes_served == len(NEW)  # the unchanged file came from the blob, not the origin
    status = env.status("roll")
    assert status["phase"] == names.PHASE_READY and "next" not in status
    assert tree(env.layout.cache_dir("team-a", "roll")) == {"shared.bin": SHARED, "weights.bin": NEW}
    retired = env.layout.retired_root("team-a", "roll")
    kept = list(retired.iterdir())
    assert len(kept) == 1 and tree(kept[0]) == {"shared.bin": SHARED, "weights.bin": OLD}  # still mounted
    assert (
        os.stat(kept[0] / "shared.bin").st_ino
        == os.stat(env.layout.cache_dir("team-a", "roll") / "shared.bin").st_ino
    )

    CsiStore(env.layout).drop_mount("vol-old")  # the Pod ended
    env.wait(lambda: not retired.exists(), "the retired revision removed")
    assert _served(env) == second


def test_a_rollback_while_the_old_copy_is_mounted_fetches_nothing(env: Env) -> None:
    first, second = _two_revisions(env)
    env.start()
    env.wait(lambda: _ready_at(env, first), "the first revision served")
    CsiStore(env.layout).record_mount(
        store.MountRecord("vol-old", "team-a", "roll", "/pods/old/volumes/m", time.time(), first)
    )
    _ask(env, second)
    env.wait(lambda: _served(env) == second, "the switch", timeout=60)
    env.hub.reset_counters()

    _ask(env, first)  # back: the first revision is still on disk (a Pod mounts it)
    env.wait(lambda: _served(env) == first, "the rollback")
    env.wait(lambda: _ready_at(env, first), "Ready at the first revision")
    assert env.hub.bytes_served == 0
    assert tree(env.layout.cache_dir("team-a", "roll")) == {"shared.bin": SHARED, "weights.bin": OLD}
    # the second revision was never mounted: it went at once
    env.wait(lambda: not env.layout.retired_root("team-a", "roll").exists(), "the unmounted revision removed")


def test_switch_false_holds_the_new_revision_beside_until_allowed(env: Env) -> None:
    first, second = _two_revisions(env)
    env.start()
    env.wait(lambda: _ready_at(env, first), "the first revision served")
    _ask(env, second, switch=False)
    env.wait(
        lambda: (env.status("roll").get("next") or {}).get("phase") == names.NEXT_READY,
        "held beside",
        timeout=60,
    )
    status = env.status("roll")
    assert status["phase"] == names.PHASE_READY and status["resolvedRevision"] == first
    assert status["next"]["resolvedRevision"] == second
    assert _served(env) == first and env.layout.is_complete("team-a", "roll")

    _ask(env, second, switch=True)
    env.wait(lambda: _ready_at(env, second), "the switch")
    assert "next" not in env.status("roll")


def test_a_revision_that_cannot_be_fetched_leaves_the_old_one_serving(env: Env) -> None:
    first, second = _two_revisions(env)
    env.start()
    env.wait(lambda: _ready_at(env, first), "the first revision served")
    _ask(env, "no-such-branch")
    env.wait(lambda: (env.status("roll").get("next") or {}).get("phase") == names.PHASE_FAILED, "next Failed")
    status = env.status("roll")
    assert status["phase"] == names.PHASE_READY and status["resolvedRevision"] == first
    beside = status["next"]
    assert beside["revision"] == "no-such-branch" and beside["reason"] == "RevisionNotFound"
    assert "retrying in" in beside["message"]
    assert _served(env) == first and env.layout.is_complete("team-a", "roll")

    _ask(env, second)  # fixed: the retry fetches the asked revision, the failure's words are gone
    env.wait(lambda: _ready_at(env, second), "the switch", timeout=60)
    assert "next" not in env.status("roll")
