"""Hooks TLS: one chart-made CA (kept across upgrades) that the webhooks and Metacontroller trust inline;
cert-manager (default) issues the serving certificate from it, or the chart signs it itself.

The upgrade case runs Helm's cluster-aware render (`lookup` really queries the
real API server, through the fault proxy whose log shows the lookup) so reuse is proven by the
real template engine reading a real Secret back, not by inspecting templates.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

import helm_python as helm
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from testkit.helm_chart import CHART_DIR, NAMESPACE, RELEASE, find, one, parse_manifests, render_objects
from testkit.kube_real import RealKube

SELF_SIGNED = {"webhooks": {"certManager": {"enabled": False}}}
TLS_SECRET = f"{RELEASE}-hooks-tls"  # the chart also renders the peer Secret
SERVICE_NAMES = {
    "praesto-hooks",
    "praesto-hooks.praesto-system",
    "praesto-hooks.praesto-system.svc",
    "praesto-hooks.praesto-system.svc.cluster.local",
}


def webhook_configs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return find(objects, "MutatingWebhookConfiguration") + find(objects, "ValidatingWebhookConfiguration")


def tls_volume_secret(objects: list[dict[str, Any]]) -> str:
    pod = one(objects, "Deployment", "praesto-hooks")["spec"]["template"]["spec"]
    return str(next(v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == "tls"))


def controller_ca_bundles(objects: list[dict[str, Any]]) -> list[str]:
    """The inline CA of every Metacontroller hook (CompositeController and DecoratorController)."""
    return [
        hook["webhook"]["caBundle"]["inline"]
        for kind in ("CompositeController", "DecoratorController")
        for controller in find(objects, kind)
        for hook in controller["spec"]["hooks"].values()
    ]


def test_cert_manager_issues_from_the_charts_own_ca() -> None:
    objects = render_objects()
    assert not find(objects, "Secret", TLS_SECRET)
    issuers = {i["metadata"]["name"]: i for i in find(objects, "Issuer")}
    certs = {c["metadata"]["name"]: c for c in find(objects, "Certificate")}
    ca_secret = one(objects, "Secret", "praesto-ca")
    assert ca_secret["type"] == "kubernetes.io/tls"
    assert set(issuers) == {"praesto-ca"}
    assert issuers["praesto-ca"]["spec"] == {"ca": {"secretName": "praesto-ca"}}
    serving = certs["praesto-hooks-tls"]
    assert serving["spec"]["issuerRef"] == {"kind": "Issuer", "name": "praesto-ca"}
    assert set(serving["spec"]["dnsNames"]) == SERVICE_NAMES
    assert "server auth" in serving["spec"]["usages"]
    assert serving["spec"]["secretName"] == tls_volume_secret(objects)
    # Every client trusts that CA, inline: no cainjector, no Secret read by Metacontroller.
    ca_pem = _pem(ca_secret["data"]["tls.crt"])
    x509.load_pem_x509_certificate(ca_pem)
    for config in webhook_configs(objects):
        assert "annotations" not in config["metadata"]
        for hook in config["webhooks"]:
            assert _pem(hook["clientConfig"]["caBundle"]) == ca_pem
    bundles = controller_ca_bundles(objects)
    assert len(bundles) == 5 and all(b.strip() == ca_pem.decode().strip() for b in bundles)
    for obj in find(objects, "Issuer") + find(objects, "Certificate"):
        assert obj["apiVersion"] == "cert-manager.io/v1"
        assert obj["metadata"]["namespace"] == NAMESPACE


def _pem(b64: str) -> bytes:
    return base64.b64decode(b64)


def test_self_signed_certificate_is_a_valid_chain() -> None:
    objects = render_objects(
        SELF_SIGNED | {"webhooks": {"certManager": {"enabled": False}, "selfSigned": {"validityDays": 30}}}
    )
    assert not find(objects, "Certificate") and not find(objects, "Issuer")
    secret = one(objects, "Secret", tls_volume_secret(objects))
    assert secret["type"] == "kubernetes.io/tls"
    data = secret["data"]
    ca = x509.load_pem_x509_certificate(_pem(data["ca.crt"]))
    cert = x509.load_pem_x509_certificate(_pem(data["tls.crt"]))
    assert cert.issuer == ca.subject
    public_key = ca.public_key()
    assert isinstance(public_key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey)
    if isinstance(public_key, rsa.RSAPublicKey):
        assert cert.signature_hash_algorithm is not None
        public_key.verify(
            cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(), cert.signature_hash_algorithm
        )
    sans = set(
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
    )
    assert sans >= SERVICE_NAMES
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert datetime.timedelta(days=29) < lifetime <= datetime.timedelta(days=31)
    assert b"PRIVATE KEY" in _pem(data["tls.key"])
    for config in webhook_configs(objects):
        assert "annotations" not in config["metadata"]
        for hook in config["webhooks"]:
            assert hook["clientConfig"]["caBundle"] == data["ca.crt"]
    assert all(b.strip() == _pem(data["ca.crt"]).decode().strip() for b in controller_ca_bundles(objects))


@pytest.fixture
def cluster(kube: RealKube) -> tuple[RealKube, str]:
    """The real API server (its own discovery answers Helm) behind the proxy, whose log shows the lookups."""
    kube.ensure_namespace(NAMESPACE)
    return kube, kube.url


def cluster_render(url: str, values: dict[str, Any], *, upgrade: bool) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART_DIR) as chart, helm.Config(kube_apiserver=url, namespace=NAMESPACE) as config:
        rendered = config.render(
            chart, values, name=RELEASE, namespace=NAMESPACE, is_install=not upgrade, is_upgrade=upgrade
        )
    return parse_manifests(rendered)


def test_self_signed_certificate_survives_upgrades(cluster: tuple[RealKube, str]) -> None:
    kube, url = cluster
    first = cluster_render(url, SELF_SIGNED, upgrade=False)
    secret = one(first, "Secret", TLS_SECRET)
    kube.create(secret)  # what `helm install` would have applied

    for _ in range(2):
        again = cluster_render(url, SELF_SIGNED, upgrade=True)
        assert one(again, "Secret", TLS_SECRET)["data"] == secret["data"]
        for config in webhook_configs(again):
            assert config["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
        ca_pem = _pem(secret["data"]["ca.crt"]).decode().strip()
        assert all(b.strip() == ca_pem for b in controller_ca_bundles(again))
    assert any(r.path.endswith(f"/secrets/{secret['metadata']['name']}") for r in kube.requests)


def test_cert_manager_ca_survives_upgrades(cluster: tuple[RealKube, str]) -> None:
    kube, url = cluster
    ca_secret = one(cluster_render(url, {}, upgrade=False), "Secret", "praesto-ca")
    kube.create(ca_secret)
    again = cluster_render(url, {}, upgrade=True)
    assert one(again, "Secret", "praesto-ca")["data"] == ca_secret["data"]
    ca_pem = _pem(ca_secret["data"]["tls.crt"]).decode().strip()
    assert all(b.strip() == ca_pem for b in controller_ca_bundles(again))


def test_without_the_secret_every_render_makes_a_new_ca(cluster: tuple[RealKube, str]) -> None:
    """Negative control: reuse comes from the lookup, not from deterministic generation."""
    _, url = cluster
    one_ca = one(cluster_render(url, SELF_SIGNED, upgrade=True), "Secret", TLS_SECRET)["data"]["ca.crt"]
    other_ca = one(cluster_render(url, SELF_SIGNED, upgrade=True), "Secret", TLS_SECRET)["data"]["ca.crt"]
    assert one_ca != other_ca


def test_an_incomplete_secret_is_replaced(cluster: tuple[RealKube, str]) -> None:
    """No ca.crt (the API server itself refuses a kubernetes.io/tls Secret without tls.key)."""
    kube, url = cluster
    junk = base64.b64encode(b"junk").decode()
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "praesto-hooks-tls", "namespace": NAMESPACE},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": junk, "tls.key": junk},
        }
    )
    data = one(cluster_render(url, SELF_SIGNED, upgrade=True), "Secret", TLS_SECRET)["data"]
    assert set(data) == {"tls.crt", "tls.key", "ca.crt"}
    x509.load_pem_x509_certificate(_pem(data["tls.crt"]))
