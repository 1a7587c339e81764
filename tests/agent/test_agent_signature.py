"""The node agent verifies spec.verification's signature before it publishes a copy: trust material
read from the cache's own Secret (and only that one), SignatureInvalid on a tampered model, nothing
published; the manifest records the signer. Agent ↔ API through the real client, bytes from the hub."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from praesto import names
from testkit.agent_harness import NODE, Env, env_context, ready_condition
from testkit.egress import LOOPBACK
from testkit.kube_real import RealKube
from testkit.objects import modelcachenode
from testkit.pki import CertificateAuthority
from testkit.signed_models import key_pair, sign_with_certificate, sign_with_key

FILES = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": os.urandom(5000)}


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def _create_signed_cache(env: Env, cache: str, secret: str = "publisher-key") -> None:
    """A ModelCacheNode as the sync hook writes it for spec.verification.signature.publicKey."""
    obj = modelcachenode(cache, NODE, "team-a", source={"uri": f"hf://org/{cache}", "revision": "main"})
    obj["spec"]["verification"] = {
        "method": "publicKey",
        "path": names.DEFAULT_SIGNATURE_FILE,
        "secretRef": {"name": secret, "key": "key.pub"},
    }
    env.kube.create(obj)


def _create_key_secret(env: Env, name: str, public_pem: bytes) -> None:
    env.kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": "team-a"},
            "data": {"key.pub": base64.b64encode(public_pem).decode()},
        }
    )


def test_signed_model_is_published_after_the_trust_secret_appears(env: Env, tmp_path: Path) -> None:
    publisher = key_pair(tmp_path / "keys" / "publisher.key")
    env.hub.add_repo("org/signed", sign_with_key(FILES, publisher))
    _create_signed_cache(env, "signed")
    env.start()
    status = env.wait_reason("signed", "WaitingForSecret")  # no key yet: wait, never download unverified
    assert "team-a/publisher-key" in status["message"]
    assert not env.layout.cache_dir("team-a", "signed").exists()
    _create_key_secret(env, "publisher-key", publisher.cert_path.read_bytes())
    env.wait_phase("signed", names.PHASE_READY)
    published = env.layout.cache_dir("team-a", "signed")
    record = json.loads((published / names.MANIFEST_FILE).read_text())[names.MANIFEST_SIGNATURE]
    assert record["method"] == "publicKey" and record["signer"].startswith("key sha256:")
    assert record["trustFrom"].startswith("Secret team-a/publisher-key key key.pub")
    secret_reads = {
        (r.verb, r.namespace, r.name or r.query.get("fieldSelector"))
        for r in env.kube.requests
        if r.resource == "secrets"
    }
    # read by the download, and re-read by GET to follow it (agent/trust_material.py): never listed
    # nor watched, which the trust Role (get only) would refuse
    assert secret_reads == {("get", "team-a", "publisher-key")}


def test_tampered_model_fails_with_signature_invalid_and_nothing_is_published(
    env: Env, tmp_path: Path
) -> None:
    publisher = key_pair(tmp_path / "keys" / "publisher.key")
    files = sign_with_key(FILES, publisher)
    files["extra.bin"] = b"slipped in after signing"
    env.hub.add_repo("org/tampered", files)
    _create_key_secret(env, "publisher-key", publisher.cert_path.read_bytes())
    _create_signed_cache(env, "tampered")
    env.start()
    status = env.wait_reason("tampered", "SignatureInvalid")
    assert status["phase"] == names.PHASE_FAILED
    message = status.get("message") or ready_condition(status).get("message", "")
    assert "model.sig" in message and "extra.bin" in message
    assert not env.layout.cache_dir("team-a", "tampered").exists()
    events = [e for e in env.kube.list("events", "team-a") if e["reason"] == "SignatureInvalid"]
    assert events and events[0]["type"] == "Warning"
    assert env.metric("praesto_agent_download_failures_total", reason="SignatureInvalid") >= 1


def test_certificate_trust_from_a_config_map(env: Env, tmp_path: Path) -> None:
    """The CA certificates in a ConfigMap of the cache's namespace; the signing certificate it issued
    rides in the bundle. Only that ConfigMap is read, and no Secret."""
    ca = CertificateAuthority(tmp_path / "pki", "publisher-ca")
    env.hub.add_repo("org/certified", sign_with_certificate(FILES, ca, common_name="publisher.example"))
    env.kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "publisher-ca", "namespace": "team-a"},
            "data": {"ca.pem": ca.pem.decode()},
        }
    )
    obj = modelcachenode(
        "certified", NODE, "team-a", source={"uri": "hf://org/certified", "revision": "main"}
    )
    obj["spec"]["verification"] = {
        "method": "certificate",
        "path": names.DEFAULT_SIGNATURE_FILE,
        "configMapRef": {"name": "publisher-ca", "key": "ca.pem"},
    }
    env.kube.create(obj)
    env.start()
    env.wait_phase("certified", names.PHASE_READY)
    published = env.layout.cache_dir("team-a", "certified")
    record = json.loads((published / names.MANIFEST_FILE).read_text())[names.MANIFEST_SIGNATURE]
    assert record["method"] == "certificate" and record["signer"].startswith("CN=publisher.example")
    assert record["trustFrom"].startswith("ConfigMap team-a/publisher-ca key ca.pem")
    reads = {
        (r.verb, r.resource, r.name or r.query.get("fieldSelector"))
        for r in env.kube.requests
        if r.resource in ("secrets", "configmaps")
    }
    one = "metadata.name=publisher-ca"
    assert reads == {
        ("get", "configmaps", "publisher-ca"),
        ("list", "configmaps", one),
        ("watch", "configmaps", one),
    }


def test_an_unsigned_prebaked_copy_does_not_stand_in_for_a_cache_that_verifies(
    env: Env, tmp_path: Path
) -> None:
    """A copy pre-baked by `praesto-agent download` without --signature-* (no cache UID, no signature
    record) would be adopted by a cache of its source; with spec.verification it is discarded and
    the model downloaded again, verified (store.copy_mismatch)."""
    from praesto.agent.download import Options
    from praesto.agent.download.fetch import download, plan

    from praesto.spec import parse_uri

    publisher = key_pair(tmp_path / "keys" / "publisher.key")
    env.hub.add_repo("org/prebaked", sign_with_key(FILES, publisher))
    source, _ = parse_uri("hf://org/prebaked")
    assert source is not None
    options = Options(endpoint=env.hub.endpoint, egress=LOOPBACK)  # the hub's CDN is on loopback too
    download(plan(source, options), env.layout.cache_dir("team-a", "prebaked"), options)
    assert names.MANIFEST_SIGNATURE not in json.loads(
        (env.layout.cache_dir("team-a", "prebaked") / names.MANIFEST_FILE).read_text()
    )
    _create_key_secret(env, "publisher-key", publisher.cert_path.read_bytes())
    _create_signed_cache(env, "prebaked")
    env.start()
    env.wait_phase("prebaked", names.PHASE_READY)
    manifest = json.loads((env.layout.cache_dir("team-a", "prebaked") / names.MANIFEST_FILE).read_text())
    assert manifest[names.MANIFEST_SIGNATURE]["method"] == "publicKey"
    assert "discarded a copy that is not this cache's" in env.log.getvalue()
