"""Issue 12, finding 4: naming a Secret in a ModelCache needs the right to read it.

Through the real API server: a tenant ServiceAccount that may create
ModelCaches but not read Secrets names `prod-db-password`; the chart's
ValidatingAdmissionPolicy `*-modelcache-secret-access` has the API server's
authorizer check the author and refuses. Once the tenant is granted `get` on
that Secret, the same ModelCache is admitted. Updates that change what a cache
fetches: test_secret_access_updates.py.
"""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.chart_install import ensure_namespace
from testkit.controlplane import wait_for
from testkit.kube_apply import Kube
from tests.cluster.flows import validator_down
from tests.cluster.installed import Installed
from tests.cluster.tenants import grant, modelcache

TENANT = "secret-access"
AUTHOR = "model-author"
SECRET = "prod-db-password"


@pytest.fixture(scope="module")
def author(installed: Installed) -> Kube:
    admin = installed.admin
    ensure_namespace(admin, TENANT)
    rules = [{"apiGroups": [names.GROUP], "resources": [names.MODELCACHE_PLURAL], "verbs": ["create", "get"]}]
    grant(admin, TENANT, AUTHOR, "author", rules)
    admin.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": TENANT},
            "stringData": {"password": "hunter2"},
        }
    )
    return installed.kube_as(AUTHOR, TENANT)


def borrowing(name: str) -> dict[str, object]:
    token = {"secretRef": {"name": SECRET, "key": "password"}}
    return modelcache(name, TENANT, source={"huggingface": {"repo": "attacker/exfil", "token": token}})


def test_a_secret_the_author_cannot_read_is_refused_then_admitted_once_granted(
    installed: Installed, author: Kube
) -> None:
    with pytest.raises(ApiException) as refused:
        author.create(borrowing("exfil"))
    assert refused.value.status == 403
    body = str(refused.value.body)
    assert "spec.source.huggingface.token.secretRef.name" in body
    assert f"system:serviceaccount:{TENANT}:{AUTHOR} may not get Secret '{SECRET}'" in body
    assert "hunter2" not in body

    read = [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET], "verbs": ["get"]}]
    grant(installed.admin, TENANT, AUTHOR, "read-db-password", read)

    def admitted() -> bool:
        try:
            author.create(borrowing("granted"))
        except ApiException as err:
            if err.status != 403:  # 403: the grant has not reached the authorizer yet
                raise
            return False
        return True

    wait_for("the ModelCache to be admitted once the author may read the Secret", admitted, 30)


def test_the_object_store_form_is_checked_and_named_too(author: Kube) -> None:
    s3 = {"uri": "s3://attacker-bucket/x", "secretRef": {"name": "aws-prod"}}
    with pytest.raises(ApiException) as refused:
        author.create(modelcache("exfil-s3", TENANT, source=s3))
    assert refused.value.status == 403
    assert (
        f"spec.source.secretRef.name: system:serviceaccount:{TENANT}:{AUTHOR} may not get Secret 'aws-prod'"
        in str(refused.value.body)
    )


def test_the_modelscope_token_is_checked_and_named_too(author: Kube) -> None:
    """The policy reads each hub form's token (praesto/kinds.py): ModelScope's as Hugging Face's."""
    token = {"secretRef": {"name": "ms-token", "key": "token"}}
    source = {"modelscope": {"repo": "attacker/exfil", "token": token}}
    with pytest.raises(ApiException) as refused:
        author.create(modelcache("exfil-ms", TENANT, source=source))
    assert refused.value.status == 403
    assert (
        f"spec.source.modelscope.token.secretRef.name: system:serviceaccount:{TENANT}:{AUTHOR} "
        "may not get Secret 'ms-token'" in str(refused.value.body)
    )


def test_the_secret_check_holds_when_the_validator_fails_open(installed: Installed, author: Kube) -> None:
    """Issue 21 item 16: webhooks.modelCaches.failurePolicy Ignore and a hooks outage admit unchecked
    specs, but naming a Secret the author cannot read is still refused: the API server checks it
    itself (the chart's ValidatingAdmissionPolicy), so it cannot fail open."""
    token = {"secretRef": {"name": "not-granted", "key": "password"}}
    body = modelcache("outage", TENANT, source={"huggingface": {"repo": "attacker/exfil", "token": token}})
    with validator_down(installed, TENANT):
        with pytest.raises(ApiException) as refused:
            author.create(body)
    assert refused.value.status == 403, refused.value.body
    assert f"may not get Secret 'not-granted' in namespace {TENANT}" in str(refused.value.body)
    assert author.get(names.API_VERSION, names.MODELCACHE_KIND, "outage", TENANT) is None


def test_the_trust_secret_of_spec_verification_is_checked_and_named_too(author: Kube) -> None:
    """#25 part 3: the node agent reads the trust Secret with Praesto's rights, like a token Secret."""
    # not SECRET: the first test grants the author `get` on it
    trust = {"signature": {"publicKey": {"secretRef": {"name": "someone-elses-key", "key": "key.pub"}}}}
    with pytest.raises(ApiException) as refused:
        author.create(modelcache("exfil-trust", TENANT, verification=trust))
    assert refused.value.status == 403
    body = str(refused.value.body)
    assert (
        f"spec.verification.signature.publicKey.secretRef.name: system:serviceaccount:{TENANT}:{AUTHOR} "
        "may not get Secret 'someone-elses-key'" in body
    )

    in_config_map = {"signature": {"certificate": {"configMapRef": {"name": "team-ca", "key": "ca.pem"}}}}
    with pytest.raises(ApiException) as refused:
        author.create(modelcache("exfil-ca", TENANT, verification=in_config_map))
    assert refused.value.status == 403
    assert (
        f"spec.verification.signature.certificate.configMapRef.name: system:serviceaccount:{TENANT}:{AUTHOR} "
        "may not get ConfigMap 'team-ca'" in str(refused.value.body)
    )
