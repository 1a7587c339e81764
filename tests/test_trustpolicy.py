"""The platform's signing trust and signed-only namespaces (praesto/trustpolicy.py): what the hooks
refuse, what the PVC-mode Job carries, what the node agent verifies with."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest
from praesto.agent.copies import ref_of
from praesto.agent.credentials import CredentialPolicy, required_signature, signature_policy
from praesto.agent.kube import SecretUnavailable
from praesto.hooks.modelcache import sync
from praesto.hooks.pvc_job import download_job

from praesto import names, store, trustpolicy
from praesto.spec import parse_spec
from praesto.trustpolicy import ClusterTrust, TrustPolicy, load_trust_dir, trust_file_name
from testkit.configmap_volume import project
from testkit.hook_objects import NOW, modelcache, sync_request
from tests.hooks.golden import CONFIG

PEM = b"-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n"
POLICY = TrustPolicy({"platform": ClusterTrust("publicKey", PEM)}, ("signed-only",))
CONFIG_WITH_TRUST = dataclasses.replace(CONFIG, trust_policy=POLICY)


def _spec(verification: Any = None, **storage: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "source": {"huggingface": {"repo": "org/m"}},
        "storage": {"size": "1Gi", **storage},
    }
    if verification is not None:
        spec["verification"] = verification
    return spec


def _platform(method: str = "publicKey", name: str = "platform") -> dict[str, Any]:
    return {"signature": {method: {"clusterTrust": name}}}


def test_the_mounted_configmap_is_read_by_name_and_method(tmp_path: Path) -> None:
    (tmp_path / trust_file_name("platform", "publicKey")).write_bytes(PEM)
    (tmp_path / trust_file_name("corp-ca", "certificate")).write_bytes(b"ca")
    (tmp_path / "..data").mkdir()  # the kubelet's own entries are skipped
    (tmp_path / "README").write_text("not trust")
    found = load_trust_dir(tmp_path)
    assert found == {
        "platform": ClusterTrust("publicKey", PEM),
        "corp-ca": ClusterTrust("certificate", b"ca"),
    }
    with pytest.raises(ValueError, match="does not exist"):
        load_trust_dir(tmp_path / "missing")


@pytest.mark.parametrize(
    ("namespace", "verification", "says"),
    [
        ("signed-only", None, "only signed models"),
        ("team", _platform(name="nobody"), "no trust named 'nobody' (it has: platform)"),
        ("team", _platform("certificate"), "is a publicKey, not a certificate"),
    ],
)
def test_refusals_name_the_field_the_cause_and_the_fix(namespace: str, verification: Any, says: str) -> None:
    errors = POLICY.errors(namespace, parse_spec(_spec(verification)).verification)
    assert len(errors) == 1 and says in errors[0].cause and errors[0].fix
    assert errors[0].field.startswith("spec.verification")


def test_allowed_specs_pass() -> None:
    assert not POLICY.errors("team", parse_spec(_spec()).verification)  # not a signed-only namespace
    assert not POLICY.errors("signed-only", parse_spec(_spec(_platform())).verification)
    assert TrustPolicy(required_in=(trustpolicy.ALL_NAMESPACES,)).required("anything")


def test_the_sync_hook_leaves_an_unsigned_cache_of_a_signed_only_namespace_invalid() -> None:
    parent = modelcache("m", _spec(), namespace="signed-only")
    response = sync(sync_request(parent), CONFIG_WITH_TRUST, NOW)
    assert response["children"] == []
    ready = next(c for c in response["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and "only signed models" in ready["message"]


def test_the_pvc_mode_job_carries_the_platforms_pem_on_its_pod_and_reads_it_as_a_file() -> None:
    spec = parse_spec(_spec(_platform(), storageClassName="rwx"))
    job = download_job(modelcache("m", _spec(_platform(), storageClassName="rwx")), spec, CONFIG_WITH_TRUST)
    template = job["spec"]["template"]
    assert template["metadata"]["annotations"] == {names.ANNOTATION_SIGNATURE_TRUST: PEM.decode()}
    trust = next(v for v in template["spec"]["volumes"] if v["name"] == "trust")
    (item,) = trust["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{names.ANNOTATION_SIGNATURE_TRUST}']"
    args = template["spec"]["containers"][0]["args"]
    assert args[args.index("--signature-public-key") + 1] == f"/etc/praesto/trust/{item['path']}"


class NoApi:
    """The agent must not read anything of the namespace for the platform's trust."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the platform's trust needs no API call, got {name}")


def test_the_agent_verifies_with_its_own_copy_of_the_platforms_trust() -> None:
    obj = {
        "metadata": {"name": "m-node", "namespace": "team", "uid": "u"},
        "spec": {"modelCacheName": "m", "nodeName": "n", "source": {"uri": "hf://org/m"}, "size": "1Gi",
                 "verification": {"method": "publicKey", "path": "model.sig", "clusterTrust": "platform"}},
    }  # fmt: skip
    ref = ref_of(obj)
    policy = signature_policy(NoApi(), ref, POLICY.trust)  # type: ignore[arg-type]
    assert policy is not None and policy.public_key == PEM and "platform" in policy.origin
    with pytest.raises(SecretUnavailable, match=r"verification\.trust"):
        signature_policy(NoApi(), ref, {})  # type: ignore[arg-type]
    assert CredentialPolicy().cluster_trust == {}


def test_the_agents_trust_follows_the_mounted_configmap_as_the_kubelet_updates_it(tmp_path: Path) -> None:
    """The kubelet updates a ConfigMap volume in place (testkit/configmap_volume.py, as its
    AtomicWriter does); the agent is not restarted for it, so its view is read again on change, and
    the fingerprint a copy is compared with (credentials.required_signature) moves with it."""
    mounted = tmp_path / "cluster-trust"
    project(mounted, {trust_file_name("platform", "publicKey"): PEM})
    live = trustpolicy.TrustDir(mounted)
    obj = {
        "metadata": {"name": "m-node", "namespace": "team", "uid": "u"},
        "spec": {"modelCacheName": "m", "nodeName": "n", "source": {"uri": "hf://org/m"}, "size": "1Gi",
                 "verification": {"method": "publicKey", "path": "model.sig", "clusterTrust": "platform"}},
    }  # fmt: skip
    ref = ref_of(obj)
    before = required_signature(ref, live)
    assert before is not None and before.trust.startswith("sha256:") and dict(live) == POLICY.trust

    replaced = PEM.replace(b"MFkw", b"MFkx")
    project(mounted, {trust_file_name("platform", "publicKey"): replaced})
    after = required_signature(ref, live)
    assert live["platform"].pem == replaced and after is not None and after.trust != before.trust
    record = {"method": "publicKey", "path": "model.sig", "trust": before.trust, "trustFrom": "x"}
    assert "replaced or withdrawn" in str(store.signature_mismatch(record, after))
    assert store.signature_mismatch({**record, "trust": after.trust}, after) is None

    project(mounted, {})  # the entry withdrawn: no copy stands for it
    gone = required_signature(ref, live)
    assert gone is not None and gone.trust == store.TRUST_WITHDRAWN and "platform" not in live
    assert "withdrawn" in str(store.signature_mismatch({**record, "trust": after.trust}, gone))
    with pytest.raises(SecretUnavailable, match="withdrawn"):
        signature_policy(NoApi(), ref, live)  # type: ignore[arg-type]

    project(mounted, {trust_file_name("platform", "publicKey"): PEM})
    assert live["platform"].pem == PEM  # put back: read again
    shutil.rmtree(mounted)  # unreadable now: the last trust read stays, never an empty one
    assert live["platform"].pem == PEM
    with pytest.raises(ValueError, match="does not exist"):
        trustpolicy.TrustDir(mounted)  # but an agent does not start without it
