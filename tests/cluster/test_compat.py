"""The oldest Kubernetes the chart claims (Chart.yaml kubeVersion), proven on its real kube-apiserver.

What the chart needs from the API server: the CRDs' CEL rules call `quantity()`
(Kubernetes 1.29), the Pod webhook has `matchConditions` (GA in 1.30) and the
Secret-access policy walks spec's keys and joins strings in CEL. This
starts kube-apiserver v1.30.14 (built from tests/cluster/compat-1.30) and applies
them there: a release that lacked either would refuse the objects.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator

import pytest
import yaml
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.chart_install import install_crds, point_webhooks_at
from testkit.controlplane import ControlPlane, ControlPlaneUnavailable, start_control_plane, wait_for
from testkit.helm_chart import CHART_DIR, CRD_DIR, RELEASE, find, one, render_objects
from testkit.kube_apply import Kube
from testkit.pki import CertificateAuthority
from tests.cluster.flows import merge_patch
from tests.cluster.tenants import grant, modelcache
from tests.cluster.test_install import readme_modelcaches

MODULE = "tests/cluster/compat-1.30"


@pytest.fixture(scope="module")
def oldest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        plane = start_control_plane(tmp_path_factory.mktemp("compat"), MODULE)
    except ControlPlaneUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"the control-plane tier must run in CI: {err}")
        pytest.skip(str(err))
    try:
        yield plane
    finally:
        plane.stop()


def test_the_compat_build_is_the_oldest_release_the_chart_claims(oldest: ControlPlane) -> None:
    claimed = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["kubeVersion"]
    minor = claimed.removeprefix(">=").split(".")[:2]
    assert oldest.version().removeprefix("v").split(".")[:2] == minor


def test_crds_and_their_cel_rules_work_there(oldest: ControlPlane) -> None:
    admin = Kube(oldest.admin())
    install_crds(admin, sorted(CRD_DIR.glob("*.yaml")))
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "seed"}})
    for seed in readme_modelcaches():
        body = copy.deepcopy(seed)
        body["metadata"]["namespace"] = "seed"
        assert admin.create(body)["spec"] == seed["spec"]
    bad = copy.deepcopy(readme_modelcaches()[0])
    bad["metadata"] = {"name": "zero", "namespace": "seed"}
    bad["spec"]["storage"]["size"] = "0"
    with pytest.raises(ApiException) as err:
        admin.create(bad)
    assert "storage.size must be greater than zero" in str(err.value.body)  # quantity() evaluated


def test_the_webhook_match_conditions_are_accepted_there(
    oldest: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> None:
    admin = Kube(oldest.admin())
    ca = CertificateAuthority(tmp_path_factory.mktemp("compat-ca"))
    (mutating,) = find(
        render_objects({"webhooks": {"certManager": {"enabled": False}}}), "MutatingWebhookConfiguration"
    )
    created = admin.create(point_webhooks_at(mutating, "https://127.0.0.1:9", ca.pem))
    condition = created["webhooks"][0]["matchConditions"][0]
    assert names.ANNOTATION_MODEL_MOUNTS in condition["expression"]


def test_the_secret_access_policy_checks_rolling_updates_there(oldest: ControlPlane) -> None:
    """tests/cluster/test_secret_access_updates.py's reproduction, on the oldest release."""
    admin = Kube(oldest.admin())
    install_crds(admin, sorted(CRD_DIR.glob("*.yaml")))
    objects = render_objects({"webhooks": {"certManager": {"enabled": False}}})
    policy = f"{RELEASE}-modelcache-secret-access"
    admin.apply(one(objects, "ValidatingAdmissionPolicy", policy))
    admin.apply(one(objects, "ValidatingAdmissionPolicyBinding", policy))
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "compat-tenant"}})
    admin.apply(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": "compat-tenant"}}
    )
    caches = {
        "apiGroups": [names.GROUP],
        "resources": [names.MODELCACHE_PLURAL],
        "verbs": ["create", "patch"],
    }
    grant(admin, "compat-tenant", "editor", "edit-caches", [caches])
    editor = Kube(oldest.client_as("compat-tenant", "editor"))
    s3 = {"uri": "s3://bank-data/public/model", "secretRef": {"name": "creds"}}
    probes = iter(range(1000))

    def policy_active() -> bool:  # the policy and the editor's Role reach the API server in their time
        try:
            editor.create(modelcache(f"probe-{next(probes)}", "compat-tenant", source=s3))
        except ApiException as err:
            return "may not get Secret 'creds'" in str(err.body)
        return False

    wait_for("the Secret-access policy to refuse the editor", policy_active, 60)
    admin.create(modelcache("colleagues", "compat-tenant", source=s3))

    def patch(spec: dict[str, object]) -> None:
        merge_patch(
            editor, names.API_VERSION, names.MODELCACHE_KIND, "colleagues", {"spec": spec}, "compat-tenant"
        )

    with pytest.raises(ApiException) as refused:
        patch({"source": {"uri": "s3://bank-data/hr-private/model"}})
    assert refused.value.status == 403
    assert "this update changes spec.source" in str(refused.value.body)
    patch({"updateStrategy": {"switch": "AllNodes"}})
