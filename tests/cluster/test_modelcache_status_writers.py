"""Issue 37: only Praesto's controller writes a ModelCache's status, even for a namespace-wide writer.

The sync hook reads its last status back to pin the commit every node fetches, so a status write
could move the nodes to another commit past the Secret-access check a spec change passes. The chart's
`*-modelcache-status-writers` ValidatingAdmissionPolicy keeps status writes to identities allowed to
update ModelCache status in every namespace (Metacontroller, cluster admins). The real kube-apiserver
evaluates it; the tenant holds a `*` Role in its own namespace, the widest grant a namespace admin
hands out.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.chart_install import ensure_namespace
from testkit.controlplane import wait_for
from testkit.helm_chart import RELEASE
from testkit.kube_apply import Kube
from tests.cluster.flows import merge_patch
from tests.cluster.installed import Installed
from tests.cluster.tenants import grant, modelcache

TENANT = "mc-status-writers"
EDITOR = "namespace-admin"
EVERYTHING = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
REFUSED = "a ModelCache's status is written by Praesto's controller (Metacontroller) only"
# What the attacker wants: the nodes pinned to a commit the spec never named.
PINNED = {"status": {"requestedRevision": "main", "resolvedRevision": "f" * 40, "nextRevision": "f" * 40}}


def _status_patch(kube: Kube, name: str, body: dict[str, Any]) -> dict[str, Any]:
    return merge_patch(kube, names.API_VERSION, names.MODELCACHE_KIND, name, body, TENANT, status=True)


@pytest.fixture(scope="module")
def editor(installed: Installed) -> Kube:
    """A user who may do anything in TENANT, and nothing cluster-wide; the policy loaded."""
    ensure_namespace(installed.admin, TENANT)
    grant(installed.admin, TENANT, EDITOR, "everything", EVERYTHING)
    kube = installed.kube_as(EDITOR, TENANT)
    installed.admin.apply(modelcache("probe", TENANT))

    def refuses() -> bool:  # the API server loads a new policy (and the grant) through informers
        try:
            _status_patch(kube, "probe", PINNED)
        except ApiException as err:
            return err.status == 403 and REFUSED in str(err.body)
        return False

    wait_for("the modelcache-status-writers policy to take effect", refuses, 30)
    return kube


def test_a_namespace_wide_writer_cannot_write_a_modelcache_status(installed: Installed, editor: Kube) -> None:
    made = editor.apply(modelcache("pinned", TENANT))  # the same user may create and change the cache itself
    with pytest.raises(ApiException) as info:
        _status_patch(editor, made["metadata"]["name"], PINNED)
    assert info.value.status == 403 and REFUSED in str(info.value.body), info.value.body
    after = installed.admin.get(names.API_VERSION, names.MODELCACHE_KIND, "pinned", TENANT)
    assert (
        after is not None
        and after.get("status", {}).get("resolvedRevision") != PINNED["status"]["resolvedRevision"]
    )


def test_metacontroller_writes_it(installed: Installed, metacontroller: Kube, editor: Kube) -> None:
    installed.admin.apply(modelcache("controlled", TENANT))
    written = _status_patch(metacontroller, "controlled", {"status": {"observedGeneration": 1}})
    assert written["status"]["observedGeneration"] == 1


def test_the_policy_matches_status_writes_only(installed: Installed) -> None:
    policy = installed.rendered("ValidatingAdmissionPolicy", f"{RELEASE}-modelcache-status-writers")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == [f"{names.MODELCACHE_PLURAL}/status"] and rule["operations"] == ["UPDATE"]
