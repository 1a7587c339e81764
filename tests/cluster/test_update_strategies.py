"""Each child's update strategy, as the CompositeController declares it, against edits made by hand.

InPlace (the token Role): an edit to a field the hook owns is merged back, same object.
Recreate (the RoleBinding: roleRef is immutable): a changed binding is deleted, then created again.
OnDelete (the PVC and the download Job): never updated; deleting one by hand is how to retry.
"""

from __future__ import annotations

from praesto import names
from testkit.controlplane import wait_for
from testkit.metacontroller import CompositeController
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node

NS = "strategies"
RBAC = "rbac.authorization.k8s.io/v1"


def test_inplace_recreate_and_ondelete(installed: Installed, composite: CompositeController) -> None:
    opted_in_namespace(installed.admin, NS)
    source = {"huggingface": {"repo": "org/p", "token": {"secretRef": {"name": "hf", "key": "HF_TOKEN"}}}}
    # A selected Node with no agent: its copy stays unreported, so the grant's Role and RoleBinding
    # exist (hooks/local.py copies_need_secret) beside that one ModelCacheNode.
    ready_node(installed.admin, "strategies-node", {"test.praesto.io/pool": "strategies"})
    installed.admin.create(
        modelcache("grant", NS, node_selector={"test.praesto.io/pool": "strategies"}, source=source)
    )
    name = names.secret_reader_role_name("grant")
    wait_for(
        "the grant's Role and RoleBinding",
        lambda: None not in (installed.admin.get(RBAC, k, name, NS) for k in ("Role", "RoleBinding")),
        30,
    )
    role = installed.admin.get(RBAC, "Role", name, NS)
    binding = installed.admin.get(RBAC, "RoleBinding", name, NS)
    assert role is not None and binding is not None

    role["rules"][0]["resourceNames"] = ["someone-elses-secret"]
    installed.admin.resource(RBAC, "Role").replace(body=role, namespace=NS)
    wait_for("the Role's rule merged back", lambda: resource_names(installed, name) == ["hf"], 30)
    restored = installed.admin.get(RBAC, "Role", name, NS)
    assert restored is not None and restored["metadata"]["uid"] == role["metadata"]["uid"]  # InPlace
    assert restored["rules"][0]["resourceNames"] == ["hf"]

    binding["subjects"][0]["name"] = "someone-else"
    installed.admin.resource(RBAC, "RoleBinding").replace(body=binding, namespace=NS)
    # Recreate: one pass deletes the edited binding, the pass its deletion triggers creates it again.
    wait_for(
        "the edited binding to be replaced",
        lambda: (
            (installed.admin.get(RBAC, "RoleBinding", name, NS) or binding)["metadata"]["uid"]
            != binding["metadata"]["uid"]
        ),
        30,
    )
    again = installed.admin.get(RBAC, "RoleBinding", name, NS)
    assert again is not None and again["metadata"]["uid"] != binding["metadata"]["uid"]
    assert again["subjects"][0]["name"] != "someone-else"

    installed.admin.apply(
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "strategies-rwx"},
         "provisioner": "nfs.example.com"}
    )  # fmt: skip
    pvc_source = {"huggingface": {"repo": "org/p"}}
    storage = {"size": "1Gi", "storageClassName": "strategies-rwx"}
    installed.admin.create(modelcache("shared", NS, source=pvc_source, storage=storage))
    wait_for(
        "the PVC",
        lambda: installed.admin.get("v1", "PersistentVolumeClaim", names.pvc_name("shared"), NS) is not None,
        30,
    )
    pvc = installed.admin.get("v1", "PersistentVolumeClaim", names.pvc_name("shared"), NS)
    assert pvc is not None
    pvc["metadata"]["labels"][names.LABEL_MODEL_CACHE] = "edited"
    edited = installed.admin.resource("v1", "PersistentVolumeClaim").replace(body=pvc, namespace=NS).to_dict()
    # The pass the edit triggers (an owned child's event) leaves it alone.
    result = composite.wait_pass(f"{NS}/shared", lambda p: p.triggered_by("update", edited), 30)
    kept = installed.admin.get("v1", "PersistentVolumeClaim", names.pvc_name("shared"), NS)
    assert kept is not None and kept["metadata"]["labels"][names.LABEL_MODEL_CACHE] == "edited"  # OnDelete
    assert not result.error and not [w for w in result.writes if "PersistentVolumeClaim" in w]


def resource_names(installed: Installed, role: str) -> list[str] | None:
    found = installed.admin.get(RBAC, "Role", role, NS)
    return found["rules"][0].get("resourceNames") if found else None
