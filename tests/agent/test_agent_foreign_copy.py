"""A complete copy is Ready only for the cache it was downloaded for (#21 item 9).

A node away while its cache was deleted and created again under the same name, with
another source or by another tenant, came back to the old copy at the new cache's
path and served it as Ready: the completion marker said only "complete". The agent
now compares the manifest's source, revision and owning cache UID with the
ModelCacheNode, and discards and downloads again on a mismatch, waiting while a Pod
still mounts the foreign copy. Real agent, real downloads from the local hub.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from praesto.csi.storefs import CsiStore

from praesto import names, store
from testkit.agent_harness import MCN, NODE, Env, env_context, tree
from testkit.kube_real import RealKube

CACHE = "model"


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def _owned_mcn(env: Env, repo: str, uid: str) -> None:
    """The ModelCacheNode as Metacontroller makes it: owned (controller) by ModelCache `uid`."""
    obj: dict[str, Any] = {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHENODE_KIND,
        "metadata": {
            "name": names.modelcachenode_name(CACHE, NODE),
            "namespace": "team-a",
            "labels": {names.LABEL_NODE: names.node_label_value(NODE), names.LABEL_MODEL_CACHE: CACHE},
            "ownerReferences": [
                {
                    "apiVersion": names.API_VERSION,
                    "kind": names.MODELCACHE_KIND,
                    "name": CACHE,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                },
            ],
        },
        "spec": {
            "modelCacheName": CACHE,
            "nodeName": NODE,
            "source": {"uri": f"hf://{repo}", "revision": "main"},
            "size": "1Gi",
        },
    }
    env.kube.create(obj)


def _recreated_while_away(env: Env, repo: str, uid: str) -> None:
    """The agent is down; the cache is deleted (its node copy left behind) and created again."""
    assert env.agent is not None
    env.agent.stop()
    name = names.modelcachenode_name(CACHE, NODE)
    env.kube.patch(MCN, name, {"metadata": {"finalizers": []}}, "team-a")
    env.kube.delete(MCN, name, "team-a")
    _owned_mcn(env, repo, uid)


def _manifest(env: Env) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(env.layout.manifest_path("team-a", CACHE).read_text())
    return manifest


def test_a_copy_of_another_source_left_under_the_name_is_discarded_and_downloaded_again(env: Env) -> None:
    env.hub.add_repo("org/first", {"weights.bin": b"first tenant's model"})
    second = env.hub.add_repo("org/second", {"weights.bin": b"the new cache's model", "extra.txt": b"x"})
    _owned_mcn(env, "org/first", "uid-1")
    env.start()
    env.wait_phase(CACHE, names.PHASE_READY)
    assert _manifest(env)[names.MANIFEST_CACHE_UID] == "uid-1"

    _recreated_while_away(env, "org/second", "uid-2")
    env.start()
    status = env.wait_phase(CACHE, names.PHASE_READY)
    assert status["resolvedRevision"] == second
    assert tree(env.layout.cache_dir("team-a", CACHE)) == {
        "weights.bin": b"the new cache's model",
        "extra.txt": b"x",
    }
    manifest = _manifest(env)
    assert (manifest["source"], manifest[names.MANIFEST_CACHE_UID]) == ("hf://org/second", "uid-2")
    assert "discarded a copy that is not this cache's" in env.log.getvalue()


def test_a_copy_of_the_same_source_for_an_earlier_cache_is_not_inherited(env: Env) -> None:
    """Same name, same (possibly private) source, another ModelCache UID: the new cache gets its
    own download (with its own credentials), never the earlier cache's bytes."""
    env.hub.add_repo("org/private", {"weights.bin": b"private bytes"})
    _owned_mcn(env, "org/private", "uid-1")
    env.start()
    env.wait_phase(CACHE, names.PHASE_READY)
    assert _manifest_uid(env) == "uid-1"

    _recreated_while_away(env, "org/private", "uid-2")
    env.start()
    env.wait(lambda: _manifest_uid(env) == "uid-2", "the copy downloaded again for uid-2")
    env.wait_phase(CACHE, names.PHASE_READY)
    assert _manifest_uid(env) == "uid-2"  # its own copy (not an inode check: numbers are reused)


def _manifest_uid(env: Env) -> str | None:
    data = store.read_json(env.layout.manifest_path("team-a", CACHE)) or {}
    return data.get(names.MANIFEST_CACHE_UID) if env.layout.is_complete("team-a", CACHE) else None


def test_a_foreign_copy_still_mounted_is_unpublished_and_never_ready(env: Env) -> None:
    env.hub.add_repo("org/first", {"weights.bin": b"first"})
    env.hub.add_repo("org/second", {"weights.bin": b"second"})
    _owned_mcn(env, "org/first", "uid-1")
    env.start()
    env.wait_phase(CACHE, names.PHASE_READY)
    mount = store.MountRecord("csi-vol-1", "team-a", CACHE, "/var/lib/kubelet/pods/p/vol", time.time())
    CsiStore(env.layout).record_mount(mount)

    _recreated_while_away(env, "org/second", "uid-2")
    env.start()
    env.wait(
        lambda: "not this cache's" in str(env.status(CACHE).get("conditions")),
        "the status naming the foreign copy",
    )
    assert env.status(CACHE).get("phase") == names.PHASE_PENDING
    assert not env.layout.is_complete("team-a", CACHE), "no new Pod may mount the foreign copy"

    CsiStore(env.layout).drop_mount(mount.volume_id)
    env.wait(lambda: _manifest_uid(env) == "uid-2", "the right copy once the mount ended")
    assert tree(env.layout.cache_dir("team-a", CACHE)) == {"weights.bin": b"second"}


def test_copy_mismatch_names_what_differs() -> None:
    manifest = {
        "source": "hf://org/a",
        "revision": "main",
        "resolvedRevision": "c" * 40,
        "allowPatterns": [],
        "ignorePatterns": [],
        names.MANIFEST_CACHE_UID: "uid-1",
    }

    def check(**changes: Any) -> str | None:
        args: dict[str, Any] = {"source": "hf://org/a", "revision": "main", "allow_patterns": (),
                                "ignore_patterns": (), "cache_uid": "uid-1", **changes}  # fmt: skip
        return store.copy_mismatch(manifest, **args)

    assert check() is None
    assert check(revision="c" * 40) is None  # the hooks pin the branch to the commit it resolved to
    assert check(cache_uid="") is None  # a ModelCacheNode without owner (tests, hand-made)
    assert "hf://org/a" in str(check(source="hf://org/b"))
    assert "revision" in str(check(revision="d" * 40))
    assert "allowPatterns" in str(check(allow_patterns=("*.json",)))
    assert "uid-1" in str(check(cache_uid="uid-2"))
    prebaked = {k: v for k, v in manifest.items() if k != names.MANIFEST_CACHE_UID}
    assert store.copy_mismatch(prebaked, source="hf://org/a", revision="main", allow_patterns=(),
                               ignore_patterns=(), cache_uid="uid-2") is None  # fmt: skip
