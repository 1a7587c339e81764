"""WatchedLookups: the real `kubernetes` client against the real API server, faults from the proxy (410, outages)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from praesto.hooks.admission import lookup as lookup_module
from praesto.hooks.admission.lookup import LookupUnavailable, WatchedLookups

from praesto import names, rbac
from testkit.admission_objects import CACHES, NS, modelcache
from testkit.kube_real import RealKube

DEADLINE = 10.0
MC = f"{names.MODELCACHE_PLURAL}.{names.GROUP}"


def eventually(check: Callable[[], bool], what: str) -> None:
    """Poll until `check()` holds or the deadline passes."""
    deadline = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def seed(api: RealKube) -> None:
    for obj in CACHES[:3]:
        api.create(obj, with_status=True)
    api.create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "nfs-rwx"},
            "provisioner": "x",
        }
    )
    api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"gpu": "a100"}}})


@pytest.fixture
def lookups(kube: RealKube) -> Iterator[WatchedLookups]:
    seed(kube)
    watched = WatchedLookups(kube.api_client(), watch_timeout=30, max_staleness=0.5).start()
    yield watched
    watched.stop()


def test_initial_list_serves_every_resource(lookups: WatchedLookups) -> None:
    first = CACHES[0]["metadata"]["name"]
    found = lookups.get_modelcache(NS, first)
    assert found is not None and found["metadata"]["name"] == first
    assert lookups.get_modelcache(NS, "absent") is None
    assert lookups.get_modelcache("other", first) is None
    assert lookups.storageclass_exists("nfs-rwx") and not lookups.storageclass_exists("gp3")
    assert lookups.count_nodes_matching({"gpu": "a100"}) == 1
    assert lookups.count_nodes_matching({"gpu": "h100"}) == 0


def test_watch_applies_adds_updates_and_deletes(kube: RealKube, lookups: WatchedLookups) -> None:
    kube.wait_for_watches(3)
    kube.create(modelcache("late", "Pending", namespace="ns2"), with_status=True)
    eventually(lambda: lookups.get_modelcache("ns2", "late") is not None, "an added ModelCache")
    kube.patch(MC, "late", {"status": {"phase": "Ready"}}, namespace="ns2", subresource="status")
    eventually(
        lambda: (lookups.get_modelcache("ns2", "late") or {}).get("status", {}).get("phase") == "Ready",
        "a status update",
    )
    kube.delete(MC, "late", namespace="ns2")
    eventually(lambda: lookups.get_modelcache("ns2", "late") is None, "a deletion")
    kube.delete("storageclasses.storage.k8s.io", "nfs-rwx")
    eventually(lambda: not lookups.storageclass_exists("nfs-rwx"), "a deleted StorageClass")


def _lists(api: RealKube, resource: str) -> int:
    return sum(1 for r in api.requests if r.verb == "list" and r.resource == resource)


def test_410_gone_relists_and_keeps_up(kube: RealKube, lookups: WatchedLookups) -> None:
    kube.wait_for_watches(3)
    before = _lists(kube, names.MODELCACHE_PLURAL)
    kube.expire_watches()
    eventually(lambda: _lists(kube, names.MODELCACHE_PLURAL) > before, "a relist after 410 Gone")
    kube.create(modelcache("after-410", "Ready"), with_status=True)
    eventually(lambda: lookups.get_modelcache(NS, "after-410") is not None, "an event after the relist")


def test_dropped_watch_reconnects(kube: RealKube, lookups: WatchedLookups) -> None:
    kube.wait_for_watches(3)
    kube.drop_watches()
    kube.create(modelcache("after-drop", "Ready"), with_status=True)
    eventually(
        lambda: lookups.get_modelcache(NS, "after-drop") is not None, "an object created during the outage"
    )


def test_outage_longer_than_staleness_refuses(kube: RealKube, lookups: WatchedLookups) -> None:
    assert lookups.get_modelcache(NS, "x") is None
    kube.wait_for_watches(3)  # the API goes away under open watches
    kube.proxy.stop()

    def unavailable() -> bool:
        try:
            lookups.get_modelcache(NS, "x")
        except LookupUnavailable as error:
            return "unreachable" in str(error)
        return False

    eventually(unavailable, "LookupUnavailable after the API went away")


def test_cold_cache_against_unreachable_api_raises() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        config = client.Configuration()
        config.host = f"http://127.0.0.1:{port}"
        watched = WatchedLookups(client.ApiClient(config), watch_timeout=5, cold_wait=0.3).start()
        try:
            with pytest.raises(LookupUnavailable, match="ModelCache cache is not loaded yet"):
                watched.get_modelcache(NS, "x")
            with pytest.raises(LookupUnavailable, match="StorageClass"):
                watched.storageclass_exists("x")
        finally:
            watched.stop()


def test_api_use_stays_within_the_declared_rbac(kube: RealKube, lookups: WatchedLookups) -> None:
    kube.wait_for_watches(3)
    lookups.get_modelcache(NS, "x")
    allowed = {(p.group, p.resource, verb) for p in rbac.HOOKS for verb in p.verbs}
    used = {(r.group, r.resource, r.verb) for r in kube.requests}
    assert used <= allowed, used - allowed
    # cluster-wide list/watch, plus one direct GET on a miss (a cache the watch may not have yet)
    per_request = [r for r in kube.requests if r.namespace is not None]
    assert [(r.verb, r.namespace, r.name) for r in per_request] == [("get", NS, "x")]


def test_shared_lookups_disabled_by_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lookup_module, "_shared", None)
    monkeypatch.setenv(lookup_module.ENV_LOOKUPS, "off")
    shared = lookup_module.shared_lookups()
    assert lookup_module.shared_lookups() is shared  # one per process
    with pytest.raises(LookupUnavailable, match="disabled by PRAESTO_ADMISSION_LOOKUPS=off"):
        shared.get_modelcache(NS, "x")


def test_shared_lookups_without_any_kube_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(lookup_module, "_shared", None)
    monkeypatch.delenv(lookup_module.ENV_LOOKUPS, raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(LookupUnavailable, match="no Kubernetes client configuration"):
        lookup_module.shared_lookups().storageclass_exists("x")


def test_a_namespaces_caches_for_its_quota_come_from_the_watch(
    lookups: WatchedLookups,
    kube: RealKube,
) -> None:
    seeded = sorted(c["metadata"]["name"] for c in CACHES[:3] if c["metadata"]["namespace"] == NS)
    assert sorted(c["metadata"]["name"] for c in lookups.modelcaches_in(NS)) == seeded
    kube.create(modelcache("quota-late", None, namespace="other-team"))
    kube.create(modelcache("quota-new", None))
    eventually(
        lambda: "quota-new" in {c["metadata"]["name"] for c in lookups.modelcaches_in(NS)}, "the new cache"
    )
    assert all(c["metadata"]["namespace"] == NS for c in lookups.modelcaches_in(NS))
    assert lookups.modelcaches_in(NS)[0]["spec"]["storage"]["size"] == "1Gi"
