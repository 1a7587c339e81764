"""The oldest Kubernetes the chart claims (Chart.yaml kubeVersion), proven on its real kube-apiserver.

What the chart needs from the API server: the CRDs' CEL rules call `quantity()`
(Kubernetes 1.29) and the Pod webhook has `matchConditions` (GA in 1.30). This
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
from testkit.controlplane import ControlPlane, ControlPlaneUnavailable, start_control_plane
from testkit.helm_chart import CHART_DIR, CRD_DIR, find, render_objects
from testkit.kube_apply import Kube
from testkit.pki import CertificateAuthority
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
