"""Issue 21 items 16 and 17: the validator's checks hold in the sync hook when the validator fails open.

With the ModelCache validator unreachable and `failurePolicy: Ignore`, the API
server admits every ModelCache; Metacontroller (the tier's event-driven driver)
then syncs them with the real hooks. In a namespace with a 3Gi quota, caches of
1Gi, 2Gi and 2Gi created in that order all exist, and the last one stays without
children, Ready=False QuotaExceeded; a PVC-mode cache naming a downloader image
outside the allow-list gets no children either.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from praesto import names
from testkit.chart_install import ensure_namespace
from testkit.controlplane import wait_for
from testkit.kube_apply import Kube
from testkit.metacontroller import CompositeController
from tests.cluster.flows import modelcachenodes, validator_down
from tests.cluster.installed import ORDER_NAMESPACE, Installed
from tests.cluster.tenants import modelcache, ready_node

NODE = "order-node"
SELECT = {"praesto.io/test-pool": "order"}


def has_copies(admin: Kube, cache: str) -> bool:
    return bool(modelcachenodes(admin, ORDER_NAMESPACE, cache))


def ready(parent: dict[str, Any] | None, reason: str) -> bool:
    conditions = ((parent or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("reason") == reason for c in conditions)


def test_over_quota_and_unallowed_image_get_no_children_when_the_validator_fails_open(
    installed: Installed, composite: CompositeController
) -> None:
    admin = installed.admin
    ensure_namespace(admin, ORDER_NAMESPACE)
    ready_node(admin, NODE, SELECT)
    with validator_down(installed, ORDER_NAMESPACE):
        for name, size in (("q1-base", "1Gi"), ("q2-first", "2Gi"), ("q3-second", "2Gi")):
            admin.create(modelcache(name, ORDER_NAMESPACE, node_selector=SELECT, storage={"size": size}))
        pvc = {"size": "1Mi", "storageClassName": "no-such-class"}
        evil = modelcache(
            "evil-image", "default", storage=pvc, downloader={"image": "attacker.example/evil:1"}
        )
        admin.create(evil)
    refused = composite.wait_parent(ORDER_NAMESPACE, "q3-second", lambda p: ready(p, "QuotaExceeded"))
    assert refused is not None
    message = next(c["message"] for c in refused["status"]["conditions"] if c["type"] == "Ready")
    assert "quota of 3.0 GiB" in message and "used by its 2 earlier ModelCache(s)" in message
    for earlier in ("q1-base", "q2-first"):
        wait_for(f"{earlier}'s node copy", partial(has_copies, admin, earlier), 60)
    assert modelcachenodes(admin, ORDER_NAMESPACE, "q3-second") == {}
    blocked = composite.wait_parent("default", "evil-image", lambda p: ready(p, "DownloaderImageNotAllowed"))
    assert blocked is not None and blocked["status"]["phase"] == names.PHASE_FAILED
    jobs = admin.list("batch/v1", "Job", "default", f"{names.LABEL_MODEL_CACHE}=evil-image")
    claims = admin.list("v1", "PersistentVolumeClaim", "default", f"{names.LABEL_MODEL_CACHE}=evil-image")
    assert jobs == [] and claims == []
