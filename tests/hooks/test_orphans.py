"""Which node copies praesto-hooks releases: only those being deleted, held by the agent, on a vanished Node."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from praesto.hooks.orphans import releaser as orphans
from praesto.hooks.serving.server import gunicorn_options, parse_args

from praesto import names, rbac
from testkit.kube_real import RealKube
from testkit.objects import modelcachenode


def copy(
    node: str, *, deleting: bool = True, finalizers: tuple[str, ...] = (names.FINALIZER_NODE_AGENT,)
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"c-{node}",
        "namespace": "t",
        "resourceVersion": "7",
        "finalizers": list(finalizers),
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}}


def test_only_deleting_agent_held_copies_of_vanished_nodes() -> None:
    live = {"alive"}
    copies = [
        copy("gone"),
        copy("alive"),
        copy("gone", deleting=False),
        copy("gone", finalizers=("other.example/finalizer",)),
    ]
    assert orphans.orphaned(copies, lambda n: n in live) == [copies[0]]


def test_release_drops_only_our_finalizer_and_is_conditional() -> None:
    held = copy("gone", finalizers=("a.example/x", names.FINALIZER_NODE_AGENT))
    assert orphans.release_patch(held) == {
        "metadata": {"finalizers": ["a.example/x"], "resourceVersion": "7"}
    }


def test_a_copy_released_by_both_watches_counts_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both watches may release one copy at once, and the real API server answers 200 to every
    racing removal of the last finalizer (the later ones find the object gone): counted once."""
    releaser = orphans.OrphanReleaser(client.ApiClient())
    patches: list[tuple[Any, ...]] = []
    monkeypatch.setattr(releaser.custom, "patch_namespaced_custom_object", lambda *a: patches.append(a))
    held = copy("gone")
    held["metadata"]["uid"] = "uid-1"
    assert releaser.release([held], lambda _node: False) == 1
    assert releaser.release([held], lambda _node: False) == 0
    assert len(patches) == 2 and releaser.released == 1


def test_the_flag_runs_the_releaser_beside_gunicorn() -> None:
    options = gunicorn_options(parse_args(["--release-orphaned-copies"]))
    assert callable(options["when_ready"]) and callable(options["on_exit"])
    assert "when_ready" not in gunicorn_options(parse_args([]))


def _eventually(check: Callable[[], bool], what: str, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_the_releaser_frees_only_the_copy_of_a_deleted_node(kube: RealKube) -> None:
    """The releaser's two reflectors through the real client against the real API server, as the
    releaser's own ServiceAccount (granted `praesto.rbac.ORPHANS`): RBAC decides its every call."""
    mcn = f"{names.MODELCACHENODE_PLURAL}.{names.GROUP}"
    for node in ("alive", "doomed"):
        kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        held = modelcachenode("c", node, "t")
        held["metadata"]["finalizers"] = [names.FINALIZER_NODE_AGENT]
        kube.create(held)
    token = kube.identity("praesto-system", "praesto-orphans", rbac.ORPHANS)
    releaser = orphans.OrphanReleaser(kube.api_client(token)).start()
    try:
        kube.wait_for_watches(2)
        kube.delete(mcn, names.modelcachenode_name("c", "alive"), "t")  # marked; its node still runs
        kube.delete(mcn, names.modelcachenode_name("c", "doomed"), "t")
        kube.delete("nodes", "doomed")
        _eventually(
            lambda: kube.get(mcn, names.modelcachenode_name("c", "doomed"), "t") is None,
            "the orphan released",
        )
        kept = kube.get(mcn, names.modelcachenode_name("c", "alive"), "t")
        assert kept is not None and kept["metadata"]["finalizers"] == [names.FINALIZER_NODE_AGENT]
        _eventually(lambda: releaser.released == 1, "the release counted")  # counted after the patch
    finally:
        for reflector in releaser.watches:
            reflector.stop()
