"""Issue 21 item 17: the sync hook enforces the namespace quota too, in creation order.

Two 6Gi caches created in the same instant next to a 2Gi one both pass the
validating webhook under a 10Gi quota (its watch has shown neither); the sync
hook, which sees the namespace's caches as related objects, gives children to
the earlier one only. The later one stays without children, with QuotaExceeded.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from praesto.hooks import hook_protocol
from praesto.hooks import modelcache as hooks

from praesto import names
from praesto.quota import Quotas
from testkit.hook_objects import NOW, customize_request, modelcache, node, sync_request
from tests.hooks.golden import CONFIG

GiB = 1 << 30
NS = "team-q"
QUOTA = replace(CONFIG, quotas=Quotas(namespaces={NS: 10 * GiB}))
SAME_INSTANT = "2026-12-01T11:00:00Z"


def cache(name: str, size: str, created: str, **storage: str) -> dict[str, Any]:
    spec = {"source": {"huggingface": {"repo": "org/tiny"}}, "storage": {"size": size, **storage}}
    obj = modelcache(name, spec=spec, namespace=NS)
    obj["metadata"]["creationTimestamp"] = created
    return obj


def synced(parent: dict[str, Any], namespace_caches: list[dict[str, Any]]) -> dict[str, Any]:
    request = sync_request(parent, nodes=[node("node-a")])
    request["related"][hook_protocol.MODELCACHE] = {
        f"{NS}/{c['metadata']['name']}": c for c in namespace_caches
    }
    return hooks.sync(request, QUOTA, NOW)


def ready(response: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in response["status"]["conditions"] if c["type"] == "Ready")


def test_of_two_caches_created_together_the_later_one_gets_no_children() -> None:
    small = cache("base", "2Gi", "2026-12-01T10:00:00Z")
    first, second = cache("llama-a", "6Gi", SAME_INSTANT), cache("llama-b", "6Gi", SAME_INSTANT)
    everything = [small, first, second]
    assert [c["kind"] for c in synced(first, everything)["children"]] == [names.MODELCACHENODE_KIND]
    refused = synced(second, everything)
    assert refused["children"] == []
    assert refused["status"]["phase"] == names.PHASE_PENDING
    condition = ready(refused)
    assert condition["reason"] == "QuotaExceeded" and condition["status"] == "False"
    assert "quota of 10.0 GiB" in condition["message"] and "8.0 GiB" in condition["message"]
    assert "requests 6.0 GiB" in condition["message"] and "namespaceQuota" in condition["message"]
    # once the earlier cache is deleted, the later one fits and gets its children
    assert synced(second, [small, second])["children"]


def test_pvc_mode_is_held_back_the_same_way_and_an_over_quota_cache_does_not_count() -> None:
    huge = cache("huge", "20Gi", "2026-12-01T09:00:00Z", storageClassName="rwx")  # never fits
    late = cache("late", "9Gi", "2026-12-01T12:00:00Z", storageClassName="rwx")
    assert synced(huge, [huge, late])["children"] == []
    made = {c["kind"] for c in synced(late, [huge, late])["children"]}
    assert made == {"PersistentVolumeClaim", "Job", "Role", "RoleBinding"}  # the Role: live progress


def test_customize_relates_the_namespace_caches_only_where_a_quota_applies() -> None:
    def rules(config: Any, namespace: str) -> list[dict[str, Any]]:
        parent = modelcache("m", namespace=namespace)
        return hooks.customize(customize_request(parent), config, NOW)["relatedResources"]  # type: ignore[no-any-return]

    caches = {"apiVersion": names.API_VERSION, "resource": names.MODELCACHE_PLURAL, "namespace": NS}
    assert caches in rules(QUOTA, NS)
    assert all(r["resource"] != names.MODELCACHE_PLURAL for r in rules(QUOTA, "elsewhere"))
    assert all(r["resource"] != names.MODELCACHE_PLURAL for r in rules(CONFIG, NS))
