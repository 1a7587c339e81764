"""Issue 37 item 1: a change to what a ModelCache fetches needs the rights its create needs.

A rolling update moves the source's revision, tag, digest or object-store prefix, and the agents
fetch the new one with the Secret the cache names. Through the real API server with the chart's
ValidatingAdmissionPolicy `*-modelcache-secret-access`: a tenant who may update ModelCaches but not
read the team's Secret cannot move a colleague's cache (403 naming the Secret and the permission),
one who may read it can; a change that fetches nothing new (updateStrategy, labels) needs no Secret;
every other field stays as created for everyone (the CRD's rules, 422).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.chart_install import ensure_namespace
from testkit.controlplane import wait_for
from testkit.kube_apply import Kube
from tests.cluster.flows import merge_patch
from tests.cluster.installed import Installed
from tests.cluster.tenants import grant, modelcache

NS = "fetch-changes"
EDITOR = "cache-editor"  # may create and update ModelCaches, read no Secret or ConfigMap
MAINTAINER = "cache-maintainer"  # the same, and may read the team's Secrets and ConfigMap
CREDS = "bank-data-creds"  # object-store and registry credentials
TOKEN = "hf-token"
KEY = "team-key"  # a signing key in a Secret (spec.verification)
CA = "team-ca"  # a CA in a ConfigMap (spec.verification)
CLASS = "fetch-changes-rwx"  # a StorageClass for the shared PVC mode
DIGEST = "sha256:" + "a" * 64
OTHER_DIGEST = "sha256:" + "b" * 64
Obj = dict[str, Any]


@dataclass(frozen=True)
class Tenants:
    editor: Kube
    maintainer: Kube


def _readable(kube: Kube, kind: str, name: str) -> bool:
    try:
        return kube.get("v1", kind, name, NS) is not None
    except ApiException as err:
        if err.status != 403:  # 403: the grant has not reached the authorizer yet
            raise
        return False


@pytest.fixture(scope="module")
def tenants(installed: Installed) -> Tenants:
    admin = installed.admin
    ensure_namespace(admin, NS)
    for secret in (CREDS, TOKEN, KEY):
        admin.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": NS},
                "stringData": {"key": "do-not-leak"},
            }
        )
    admin.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CA, "namespace": NS}, "data": {}}
    )
    admin.apply(
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": CLASS},
         "provisioner": "example.com/rwx"}
    )  # fmt: skip
    caches = {
        "apiGroups": [names.GROUP],
        "resources": [names.MODELCACHE_PLURAL],
        "verbs": ["create", "get", "update", "patch"],
    }
    grant(admin, NS, EDITOR, "edit-caches", [caches])
    reads = [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [CREDS, TOKEN, KEY], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CA], "verbs": ["get"]},
    ]
    grant(admin, NS, MAINTAINER, "maintain-caches", [caches, *reads])
    maintainer = installed.kube_as(MAINTAINER, NS)
    granted = (("Secret", CREDS), ("Secret", TOKEN), ("Secret", KEY), ("ConfigMap", CA))
    wait_for("the maintainer's grants", lambda: all(_readable(maintainer, *read) for read in granted), 30)
    return Tenants(installed.kube_as(EDITOR, NS), maintainer)


def colleagues_cache(installed: Installed, name: str, **spec: Any) -> None:
    """A cache someone allowed to read its Secrets created (here: the cluster admin)."""
    installed.admin.create(modelcache(name, NS, **spec))


def change(kube: Kube, name: str, spec: Obj) -> Obj:
    return merge_patch(kube, names.API_VERSION, names.MODELCACHE_KIND, name, {"spec": spec}, NS)


def stored_spec(installed: Installed, name: str) -> Obj:
    found = installed.admin.get(names.API_VERSION, names.MODELCACHE_KIND, name, NS)
    assert found is not None
    return dict(found["spec"])


def refusal(kube: Kube, name: str, spec: Obj) -> str:
    """The API server's answer to a change it refuses as forbidden."""
    with pytest.raises(ApiException) as refused:
        change(kube, name, spec)
    assert refused.value.status == 403, refused.value.body
    return str(refused.value.body)


def test_moving_an_object_store_prefix_needs_get_on_its_secret(
    installed: Installed, tenants: Tenants
) -> None:
    """The reproduction: a colleague's cache of s3://bank-data/public moved to bank-data/hr-private."""
    public = {"uri": "s3://bank-data/public/model", "secretRef": {"name": CREDS}}
    with pytest.raises(ApiException) as refused:  # naming the Secret in a create is refused
        tenants.editor.create(modelcache("editors-own", NS, source=public))
    assert refused.value.status == 403
    colleagues_cache(installed, "public-model", source=public)

    private = {"source": {"uri": "s3://bank-data/hr-private/model"}}
    said = refusal(tenants.editor, "public-model", private)
    assert (
        f"spec.source.secretRef.name: system:serviceaccount:{NS}:{EDITOR} may not get Secret '{CREDS}' "
        f"in namespace {NS}"
    ) in said
    assert "this update changes spec.source" in said
    assert f"ask for `get` on secrets/{CREDS} in {NS}, or leave spec.source as it was" in said
    assert "do-not-leak" not in said
    assert stored_spec(installed, "public-model")["source"] == public

    change(tenants.maintainer, "public-model", private)
    assert stored_spec(installed, "public-model")["source"]["uri"] == "s3://bank-data/hr-private/model"


def _hf_token() -> Obj:
    return {"secretRef": {"name": TOKEN, "key": "key"}}


def _public_key_in(secret: str) -> Obj:
    return {"signature": {"publicKey": {"secretRef": {"name": secret, "key": "key"}}}}


# Every way a spec may change after create (the CRD's rules allow nothing else): the source's version
# in each form. (created spec, the change, the field the refusal names, what it may not get)
ROLLS: dict[str, tuple[Obj, Obj, str, str]] = {
    "hf-revision": (
        {"source": {"huggingface": {"repo": "team/private", "revision": "v1", "token": _hf_token()}}},
        {"source": {"huggingface": {"revision": "v2"}}},
        "spec.source.huggingface.token.secretRef.name",
        f"Secret '{TOKEN}'",
    ),
    "hf-uri-revision": (
        {"source": {"uri": "hf://team/private:v1", "secretRef": {"name": TOKEN, "key": "key"}}},
        {"source": {"uri": "hf://team/private:v2"}},
        "spec.source.secretRef.name",
        f"Secret '{TOKEN}'",
    ),
    "ms-revision": (
        {"source": {"modelscope": {"repo": "team/private", "revision": "v1", "token": _hf_token()}}},
        {"source": {"modelscope": {"revision": "v2"}}},
        "spec.source.modelscope.token.secretRef.name",
        f"Secret '{TOKEN}'",
    ),
    "ms-uri-revision": (
        {"source": {"uri": "ms://team/private:v1", "secretRef": {"name": TOKEN, "key": "key"}}},
        {"source": {"uri": "ms://team/private:v2"}},
        "spec.source.secretRef.name",
        f"Secret '{TOKEN}'",
    ),
    "gs-prefix": (
        {"source": {"uri": "gs://team-models/public/v1", "secretRef": {"name": CREDS}}},
        {"source": {"uri": "gs://team-models/private/v1"}},
        "spec.source.secretRef.name",
        f"Secret '{CREDS}'",
    ),
    "az-prefix": (
        {"source": {"uri": "az://team-models/public", "secretRef": {"name": CREDS}}},
        {"source": {"uri": "az://team-models/private"}},
        "spec.source.secretRef.name",
        f"Secret '{CREDS}'",
    ),
    "oci-tag": (
        {"source": {"oci": {"reference": "registry.example/team/model:1.0"}, "secretRef": {"name": CREDS}}},
        {"source": {"oci": {"reference": "registry.example/team/model:2.0"}}},
        "spec.source.secretRef.name",
        f"Secret '{CREDS}'",
    ),
    "oci-digest": (
        {
            "source": {
                "oci": {"reference": f"registry.example/team/model@{DIGEST}"},
                "secretRef": {"name": CREDS},
            }
        },
        {"source": {"oci": {"reference": f"registry.example/team/model@{OTHER_DIGEST}"}}},
        "spec.source.secretRef.name",
        f"Secret '{CREDS}'",
    ),
    "oci-uri-tag-to-digest": (
        {"source": {"uri": "oci://registry.example/team/model:1.0", "secretRef": {"name": CREDS}}},
        {"source": {"uri": f"oci://registry.example/team/model@{DIGEST}"}},
        "spec.source.secretRef.name",
        f"Secret '{CREDS}'",
    ),
    "revision-under-a-trust-secret": (
        {
            "source": {"huggingface": {"repo": "team/signed", "revision": "v1"}},
            "verification": _public_key_in(KEY),
        },
        {"source": {"huggingface": {"revision": "v2"}}},
        "spec.verification.signature.publicKey.secretRef.name",
        f"Secret '{KEY}'",
    ),
    "revision-under-a-trust-config-map": (
        {
            "source": {"oci": {"reference": "registry.example/team/signed:1.0"}},
            "verification": {"signature": {"certificate": {"configMapRef": {"name": CA, "key": "ca.pem"}}}},
        },
        {"source": {"oci": {"reference": "registry.example/team/signed:2.0"}}},
        "spec.verification.signature.certificate.configMapRef.name",
        f"ConfigMap '{CA}'",
    ),
}


@pytest.mark.parametrize("case", sorted(ROLLS))
def test_every_rolling_change_needs_what_a_create_needs(
    installed: Installed, tenants: Tenants, case: str
) -> None:
    created, moved, field, what = ROLLS[case]
    colleagues_cache(installed, case, **created)
    said = refusal(tenants.editor, case, moved)
    assert f"{field}: system:serviceaccount:{NS}:{EDITOR} may not get {what} in namespace {NS}" in said
    assert stored_spec(installed, case)["source"] == created["source"]

    change(tenants.maintainer, case, moved)
    assert stored_spec(installed, case)["source"] != created["source"]


def test_a_change_that_fetches_nothing_new_needs_no_secret(installed: Installed, tenants: Tenants) -> None:
    """updateStrategy says how nodes move, not what they fetch; labels are metadata."""
    s3 = {"uri": "s3://bank-data/public/other", "secretRef": {"name": CREDS}}
    colleagues_cache(installed, "strategy", source=s3, verification=_public_key_in(KEY))
    change(tenants.editor, "strategy", {"updateStrategy": {"switch": "AllNodes", "maxFetching": 2}})
    assert stored_spec(installed, "strategy")["updateStrategy"] == {"switch": "AllNodes", "maxFetching": 2}
    merge_patch(
        tenants.editor, names.API_VERSION, names.MODELCACHE_KIND, "strategy",
        {"metadata": {"labels": {"team": "bank"}}}, NS,
    )  # fmt: skip


# What nobody may change after create, whatever they may read: the CRD's rules refuse it first (422).
FIXED: dict[str, Obj] = {
    "source.secretRef": {"source": {"secretRef": {"name": TOKEN}}},
    "source.uri-bucket": {"source": {"uri": "s3://other-bucket/public/model"}},
    "source.uri-scheme": {"source": {"uri": "gs://bank-data/public/model"}},
    "source.form": {"source": {"uri": None, "oci": {"reference": "registry.example/team/model:1.0"}}},
    "verification": {"verification": _public_key_in(TOKEN)},
    "storage.storageClassName": {"storage": {"storageClassName": CLASS}},
    "storage.size": {"storage": {"size": "2Gi"}},
    "nodeSelector": {"nodeSelector": {"pool": "other"}},
    "eviction": {"eviction": {"unusedTTL": "1h"}},
    "prewarm": {"prewarm": True},
    "warmNewNodes": {"warmNewNodes": True},
    "downloader": {"downloader": {"image": "registry.example/exfil:1"}},
}
FIXED_HF: dict[str, Obj] = {
    "huggingface.repo": {"source": {"huggingface": {"repo": "team/other"}}},
    "huggingface.token": {"source": {"huggingface": {"token": {"secretRef": {"name": CREDS, "key": "key"}}}}},
    "huggingface.allowPatterns": {"source": {"huggingface": {"allowPatterns": ["*"]}}},
    "huggingface.ignorePatterns": {"source": {"huggingface": {"ignorePatterns": ["*.bin"]}}},
}


@pytest.fixture(scope="module")
def fixed_caches(installed: Installed, tenants: Tenants) -> None:
    s3 = {"uri": "s3://bank-data/public/model", "secretRef": {"name": CREDS}}
    colleagues_cache(installed, "fixed-s3", source=s3, verification=_public_key_in(KEY))
    hf = {"huggingface": {"repo": "team/private", "token": _hf_token(), "allowPatterns": ["*.json"]}}
    colleagues_cache(installed, "fixed-hf", source=hf)

    def pvc_admitted() -> bool:  # the validator's StorageClass cache is watch-fed
        try:
            colleagues_cache(
                installed, "fixed-pvc", source=s3, storage={"size": "1Gi", "storageClassName": CLASS}
            )
        except ApiException as err:
            if "does not exist" not in str(err.body):
                raise
            return False
        return True

    wait_for("the validator to know the StorageClass", pvc_admitted, 30)


@pytest.mark.parametrize(
    ("cache", "spec"),
    [("fixed-s3", s) for s in FIXED.values()]
    + [("fixed-hf", s) for s in FIXED_HF.values()]
    + [("fixed-pvc", {"source": {"uri": "s3://bank-data/public/v2"}})],
    ids=[*FIXED, *FIXED_HF, "source-in-pvc-mode"],
)
def test_nobody_changes_the_rest_after_create(
    installed: Installed, tenants: Tenants, fixed_caches: None, cache: str, spec: Obj
) -> None:
    before = stored_spec(installed, cache)
    with pytest.raises(ApiException) as refused:  # even with every read the spec names
        change(tenants.maintainer, cache, spec)
    assert refused.value.status == 422, refused.value.body
    assert "immutable" in str(refused.value.body) or "revision can change only in local mode" in str(
        refused.value.body
    )
    assert stored_spec(installed, cache) == before
