"""Signed models on the real control plane (#25 part 3): spec.verification admitted by the real API
server (CRD schema + CEL) and our webhook, carried to the node copy by the sync hook under
Metacontroller, the trust Secret read by `praesto-agent run` through the per-cache grant only while a
copy needs it; a signed model goes Ready, a tampered one leaves the cache Failed with reason
SignatureInvalid and nothing published.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from praesto import names
from praesto.store import StoreLayout
from praesto.trustpolicy import trust_file_name
from testkit.hub import LocalHub
from testkit.metacontroller import CompositeController, gone
from testkit.pki import CertificateAuthority
from testkit.signed_models import key_pair, sign_with_certificate, sign_with_key
from tests.cluster.agents import AgentProcess
from tests.cluster.flows import phase_is, wait_gone
from tests.cluster.installed import PLATFORM_TRUST, SIGNED_ONLY_NAMESPACE, Installed
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node
from tests.cluster.test_pvc_mode import CLASS, job_pod, pvc_namespace, run_like_the_kubelet
from tests.cluster.test_pvc_mode import NS as PVC_NS

NS = "signed-models"
NODE = "signing-node"
POOL = "test.praesto.io/pool"
FILES = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": b"w" * 300_000}


@pytest.fixture(scope="module")
def agent(
    installed: Installed, hub: LocalHub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    opted_in_namespace(installed.admin, NS)
    ready_node(installed.admin, NODE, {POOL: "signing"})
    workdir = tmp_path_factory.mktemp("agent") / NODE
    trust = (f"--trust-dir={installed.trust_dir}",)  # the chart's verification.trust ConfigMap, mounted
    with AgentProcess(installed, NODE, hub.endpoint, workdir, extra_args=trust) as running:
        yield running


def _verification(secret: str) -> dict[str, object]:
    return {"signature": {"publicKey": {"secretRef": {"name": secret, "key": "key.pub"}}}}


def test_signed_model_ready_and_tampered_model_failed_with_signature_invalid(
    installed: Installed,
    hub: LocalHub,
    agent: AgentProcess,
    composite: CompositeController,
    tmp_path: Path,
) -> None:
    publisher = key_pair(tmp_path / "publisher.key")
    signed = sign_with_key(FILES, publisher)
    hub.add_repo("org/signed", signed)
    hub.add_repo("org/tampered", {**signed, "config.json": b'{"model_type": "evil"}'})
    client.CoreV1Api(installed.admin.api).create_namespaced_secret(
        NS,
        {
            "metadata": {"name": "publisher-key"},
            "data": {"key.pub": base64.b64encode(publisher.cert_path.read_bytes()).decode()},
        },
    )
    selector = {POOL: "signing"}
    installed.admin.create(
        modelcache(
            "signed", NS, node_selector=selector, source={"huggingface": {"repo": "org/signed"}},
            verification=_verification("publisher-key"),
        )
    )  # fmt: skip
    installed.admin.create(
        modelcache(
            "tampered", NS, node_selector=selector, source={"huggingface": {"repo": "org/tampered"}},
            verification=_verification("publisher-key"),
        )
    )  # fmt: skip
    # the certificate method, its CA in a ConfigMap (Metacontroller grants get on that one ConfigMap)
    ca = CertificateAuthority(tmp_path / "pki", "publisher-ca")
    hub.add_repo("org/certified", sign_with_certificate(FILES, ca, common_name="publisher.example"))
    client.CoreV1Api(installed.admin.api).create_namespaced_config_map(
        NS, {"metadata": {"name": "publisher-ca"}, "data": {"ca.pem": ca.pem.decode()}}
    )
    installed.admin.create(
        modelcache(
            "certified", NS, node_selector=selector, source={"huggingface": {"repo": "org/certified"}},
            verification={"signature": {"certificate": {"configMapRef": {"name": "publisher-ca", "key": "ca.pem"}}}},
        )
    )  # fmt: skip
    composite.wait_parent(NS, "signed", phase_is(names.PHASE_READY), deadline=90)
    composite.wait_parent(NS, "certified", phase_is(names.PHASE_READY), deadline=90)
    layout = StoreLayout(agent.base)
    assert layout.is_complete(NS, "signed")
    manifest = json.loads((layout.cache_dir(NS, "signed") / names.MANIFEST_FILE).read_text())
    assert manifest[names.MANIFEST_SIGNATURE]["method"] == "publicKey"
    assert manifest[names.MANIFEST_SIGNATURE]["signer"].startswith("key sha256:")

    failed = composite.wait_parent(NS, "tampered", phase_is(names.PHASE_FAILED), deadline=90)
    ready = next(c for c in (failed or {})["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == names.REASON_SIGNATURE_INVALID, ready
    assert "model.sig" in ready["message"] and "config.json" in ready["message"]
    assert not layout.cache_dir(NS, "tampered").exists()

    # The signed cache's copy is on disk, so its grant goes; the tampered one still retries (Failed).
    wait_gone(
        installed.admin, "rbac.authorization.k8s.io/v1", "Role", names.secret_reader_role_name("signed"), NS
    )
    # ... but its trust Secret stays followed: the agent re-reads that one object by GET (real RBAC:
    # resourceNames, `get` only; agent/trust_material.py), so a replaced key is noticed
    watch_role = names.trust_reader_role_name("signed")
    assert installed.admin.get("rbac.authorization.k8s.io/v1", "Role", watch_role, NS) is not None
    assert "following trust material" in agent.log()
    assert layout.is_complete(NS, "signed")  # verified under the material the agent holds: still served

    certified = json.loads((layout.cache_dir(NS, "certified") / names.MANIFEST_FILE).read_text())
    assert certified[names.MANIFEST_SIGNATURE]["signer"].startswith("CN=publisher.example")
    for cache in ("signed", "tampered", "certified"):
        installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, cache, NS)
        composite.wait_parent(NS, cache, gone, deadline=60)


def test_admission_refuses_two_trust_methods_naming_the_field(installed: Installed) -> None:
    key = {"secretRef": {"name": "k", "key": "key.pub"}}
    both = {"signature": {"publicKey": key, "certificate": key}}
    with pytest.raises(ApiException) as info:
        installed.admin.create(modelcache("both", NS, verification=both))
    assert info.value.status == 422 and "verification.signature" in str(info.value.body)


def test_pvc_mode_job_refuses_a_tampered_model_and_the_cache_fails_with_signature_invalid(
    installed: Installed, hub: LocalHub, composite: CompositeController, tmp_path: Path
) -> None:
    """Shared PVC mode: the downloader Job mounts the trust ConfigMap; run as the kubelet would, it
    exits 4 on the tampered model, the Job controller's podFailurePolicy fails the Job at once, and
    the cache goes Failed with reason SignatureInvalid; nothing was published in the volume."""
    pvc_namespace(installed)
    publisher = key_pair(tmp_path / "publisher.key")
    hub.add_repo("org/shared-tampered", {**sign_with_key(FILES, publisher), "extra.bin": b"unsigned"})
    core = client.CoreV1Api(installed.admin.api)
    core.create_namespaced_config_map(
        PVC_NS, {"metadata": {"name": "publisher-key"}, "data": {"key.pub": publisher.cert_path.read_text()}}
    )
    installed.admin.create(
        modelcache(
            "shared-signed", PVC_NS, source={"huggingface": {"repo": "org/shared-tampered"}},
            storage={"size": "1Gi", "storageClassName": CLASS},
            verification={"signature": {"publicKey": {"configMapRef": {"name": "publisher-key", "key": "key.pub"}}}},
        )
    )  # fmt: skip
    composite.wait_parent(PVC_NS, "shared-signed", phase_is(names.PHASE_PENDING, names.PHASE_DOWNLOADING), 30)
    pod = job_pod(core, names.download_job_name("shared-signed"))
    trust = next(v for v in pod.spec.volumes if v.name == "trust")
    assert trust.config_map.name == "publisher-key"
    # what the kubelet would project from the ConfigMap into the trust volume
    (tmp_path / "volumes" / "trust").mkdir(parents=True)
    (tmp_path / "volumes" / "trust" / "trust.pem").write_bytes(publisher.cert_path.read_bytes())
    ran = run_like_the_kubelet(pod, tmp_path / "volumes", hub.endpoint)
    assert ran.returncode == names.DOWNLOAD_EXIT_SIGNATURE_INVALID, ran.stderr[-2000:]
    assert "error: SignatureInvalid: model.sig: " in ran.stderr and "extra.bin" in ran.stderr
    assert not (tmp_path / "volumes" / "cache" / names.COMPLETE_FILE).exists()
    terminated = {"exitCode": ran.returncode, "reason": "Error", "message": ran.stderr[-1000:]}
    container = pod.spec.containers[0]
    core.patch_namespaced_pod_status(
        pod.metadata.name,
        PVC_NS,
        {
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {"name": container.name, "image": container.image, "imageID": "", "ready": False,
                     "restartCount": 0, "state": {"terminated": terminated}}
                ],
            }
        },
    )  # fmt: skip
    failed = composite.wait_parent(PVC_NS, "shared-signed", phase_is(names.PHASE_FAILED), deadline=60)
    ready = next(c for c in (failed or {})["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == names.REASON_SIGNATURE_INVALID, ready
    installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "shared-signed", PVC_NS)
    composite.wait_parent(PVC_NS, "shared-signed", gone, deadline=30)


def test_the_platforms_trust_verifies_and_signed_only_namespaces_refuse_unsigned_caches(
    installed: Installed, hub: LocalHub, agent: AgentProcess, composite: CompositeController
) -> None:
    """The chart's verification.trust: a cache in any namespace names it (clusterTrust) and needs no
    Secret of its own (no grant is made); verification.requiredIn: a namespace that accepts only signed
    models refuses a cache without spec.verification, and an unknown trust name anywhere."""
    hub.add_repo("org/platform-signed", sign_with_key(FILES, installed.platform_key))
    platform = {"signature": {"publicKey": {"clusterTrust": PLATFORM_TRUST}}}
    installed.admin.create(
        modelcache(
            "platform", NS, node_selector={POOL: "signing"},
            source={"huggingface": {"repo": "org/platform-signed"}}, verification=platform,
        )
    )  # fmt: skip
    composite.wait_parent(NS, "platform", phase_is(names.PHASE_READY), deadline=90)
    manifest = json.loads(
        (StoreLayout(agent.base).cache_dir(NS, "platform") / names.MANIFEST_FILE).read_text()
    )
    assert manifest[names.MANIFEST_SIGNATURE]["method"] == "publicKey"
    role = installed.admin.get(
        "rbac.authorization.k8s.io/v1", "Role", names.secret_reader_role_name("platform"), NS
    )
    assert role is None  # the platform's trust is the agent's own: nothing of the namespace is read

    opted_in_namespace(installed.admin, SIGNED_ONLY_NAMESPACE)
    with pytest.raises(ApiException) as unsigned:
        installed.admin.create(modelcache("unsigned", SIGNED_ONLY_NAMESPACE))
    assert "spec.verification" in str(unsigned.value.body) and "only signed models" in str(
        unsigned.value.body
    )
    unknown = {"signature": {"publicKey": {"clusterTrust": "nobody"}}}
    with pytest.raises(ApiException) as refused:
        installed.admin.create(modelcache("unknown-trust", SIGNED_ONLY_NAMESPACE, verification=unknown))
    assert "clusterTrust" in str(refused.value.body) and PLATFORM_TRUST in str(refused.value.body)
    installed.admin.create(modelcache("signed-ok", SIGNED_ONLY_NAMESPACE, verification=platform))
    for namespace, cache in ((NS, "platform"), (SIGNED_ONLY_NAMESPACE, "signed-ok")):
        installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, cache, namespace)
        composite.wait_parent(namespace, cache, gone, deadline=60)


def _remount(path: Path, pem: bytes) -> None:
    """The kubelet updating the agent's mount of the trust ConfigMap: the file replaced whole."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_bytes(pem)
    staged.replace(path)


def test_a_replaced_platform_key_takes_copies_verified_under_the_old_one_out_of_ready(
    installed: Installed, hub: LocalHub, agent: AgentProcess, composite: CompositeController, tmp_path: Path
) -> None:
    """The platform replaces its key behind verification.trust (the old one withdrawn) and the kubelet
    updates the agent's mount: without an agent restart, the Ready cache verified under the old key
    leaves Ready, is fetched again and, its origin still carrying the old signature, fails
    SignatureInvalid; nothing of it stays published (issue 37 item 4)."""
    hub.add_repo("org/rotated", sign_with_key(FILES, installed.platform_key))
    platform = {"signature": {"publicKey": {"clusterTrust": PLATFORM_TRUST}}}
    installed.admin.create(
        modelcache(
            "rotated", NS, node_selector={POOL: "signing"},
            source={"huggingface": {"repo": "org/rotated"}}, verification=platform,
        )
    )  # fmt: skip
    composite.wait_parent(NS, "rotated", phase_is(names.PHASE_READY), deadline=90)
    mounted = installed.trust_dir / trust_file_name(PLATFORM_TRUST, "publicKey")
    original = mounted.read_bytes()
    try:
        _remount(mounted, key_pair(tmp_path / "replacement.key").cert_path.read_bytes())
        failed = composite.wait_parent(NS, "rotated", phase_is(names.PHASE_FAILED), deadline=90)
        ready = next(c for c in (failed or {})["status"]["conditions"] if c["type"] == "Ready")
        assert ready["reason"] == names.REASON_SIGNATURE_INVALID, ready
        assert "signed by another key" in ready["message"], ready
        assert not StoreLayout(agent.base).is_complete(NS, "rotated")
    finally:
        _remount(mounted, original)  # the other tests of the tier sign with the platform's key
        installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "rotated", NS)
        composite.wait_parent(NS, "rotated", gone, deadline=60)
