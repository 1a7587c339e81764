"""AdmissionReview over TLS to a real praesto-hooks gunicorn, lookups served by the real API server
(as the hooks' own ServiceAccount, granted `praesto.rbac.HOOKS`).

The server verifies its caller as the API server (--client-ca-file, the chart's webhooks.clientAuth)
and the tests present that client certificate, so answers describe the caches; what an unverified
caller gets is tests/admission/test_forged_reviews.py.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from praesto import names, rbac
from testkit.admission_objects import (
    CACHES,
    IMAGE,
    NS,
    Obj,
    apply_and_validate,
    modelcache,
    mounts,
    pod,
    review_body,
)
from testkit.controlplane import ControlPlane
from testkit.kube_real import RealKube, proxied
from testkit.pki import CertificateAuthority
from testkit.server import CertifiedClient, RunningServer, hooks_server, post_json

MUTATE = "/admission/mutate-pod"
VALIDATE = "/admission/validate-modelcache"


def kubeconfig(directory: Path, server: str, token: str) -> Path:
    path = directory / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "api", "cluster": {"server": server}}],
                "users": [{"name": "hooks", "user": {"token": token}}],
                "contexts": [{"name": "test", "context": {"cluster": "api", "user": "hooks"}}],
                "current-context": "test",
            }
        )
    )
    return path


def hooks_token(api: RealKube) -> str:
    """The hooks' own identity: a ServiceAccount granted `praesto.rbac.HOOKS`, as the chart does."""
    return api.identity("praesto-system", "praesto-hooks", rbac.HOOKS)


def server_env(directory: Path, api_url: str, token: str) -> dict[str, str]:
    return {
        "KUBECONFIG": str(kubeconfig(directory, api_url, token)),
        "PRAESTO_IMAGE": IMAGE,
        "PRAESTO_LOOKUP_MAX_STALENESS": "5",
        "KUBERNETES_SERVICE_HOST": "",
    }


@pytest.fixture(scope="module")
def api(kube_plane: ControlPlane) -> Iterator[RealKube]:
    with proxied(kube_plane) as real:
        for cache in CACHES:
            real.create(cache, with_status=True)
        real.create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": "nfs-rwx"},
                "provisioner": "nfs",
            }
        )
        real.create(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"gpu": "a100"}}}
        )
        yield real


@pytest.fixture(scope="module")
def server(api: RealKube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("hooks")
    token = hooks_token(api)
    client_ca = CertificateAuthority(directory / "client-pki", "webhook-client-ca")
    pair = client_ca.issue("apiserver", common_name="kube-apiserver", client=True)
    with hooks_server(
        directory,
        tls=True,
        env=server_env(directory, api.url, token),
        workers=1,
        threads=4,
        extra_args=("--client-ca-file", str(client_ca.cert_path)),
    ) as running:
        yield CertifiedClient.of(running, pair.cert_path, pair.key_path)


def admit(server: RunningServer, path: str, body: Any) -> Obj:
    status, answer = post_json(server, path, body)
    assert status == 200, answer
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert isinstance(answer, dict)
    return answer


EXPECTED = {
    "new": True,
    "pending": True,
    "downloading": True,
    "ready": True,
    "evicted": True,
    "failed": False,
}


@pytest.mark.parametrize("cache", [c["metadata"]["name"] for c in CACHES])
def test_every_phase_and_mode_over_tls(server: RunningServer, cache: str) -> None:
    mode, phase = cache.split("-", 1)
    obj = pod(mounts((cache, "/models")))
    answer = admit(server, MUTATE, review_body(obj, uid=f"uid-{cache}"))
    response = answer["response"]
    assert response["uid"] == f"uid-{cache}"
    assert response["allowed"] is EXPECTED[phase]
    if not response["allowed"]:
        assert response["status"]["code"] == 403
        assert "RepoNotFound: org/model does not exist on the Hub" in response["status"]["message"]
        return
    patched = apply_and_validate(obj, answer)
    volume = patched["spec"]["volumes"][0]
    if mode == "pvc":
        assert volume["persistentVolumeClaim"] == {"claimName": names.pvc_name(cache), "readOnly": True}
        assert patched["spec"]["initContainers"][0]["image"] == IMAGE  # PRAESTO_IMAGE reached the server
    else:
        assert volume["csi"]["driver"] == names.CSI_DRIVER_NAME
        assert names.ready_label_key(NS, cache) in json.dumps(patched["spec"]["affinity"])


def test_unannotated_pod_is_allowed_without_patch(server: RunningServer) -> None:
    assert admit(server, MUTATE, review_body(pod()))["response"] == {"uid": "uid-1", "allowed": True}


def test_unknown_cache_and_bad_annotation_are_refused(server: RunningServer) -> None:
    unknown = admit(server, MUTATE, review_body(pod(mounts(("nope", "/m")))))["response"]
    assert unknown["allowed"] is False and unknown["status"]["code"] == 403
    bad = admit(server, MUTATE, review_body(pod({names.ANNOTATION_MODEL_MOUNTS: "not json"})))["response"]
    assert bad["status"]["code"] == 400 and "is not valid JSON" in bad["status"]["message"]


def test_new_cache_is_seen_through_the_watch(server: RunningServer, api: RealKube) -> None:
    body = review_body(pod(mounts(("arrives-later", "/m"))))
    assert admit(server, MUTATE, body)["response"]["allowed"] is False
    api.create(modelcache("arrives-later", "Ready"), with_status=True)
    deadline = time.monotonic() + 10
    while not admit(server, MUTATE, body)["response"]["allowed"]:
        assert time.monotonic() < deadline, "the new ModelCache never reached the webhook"
        time.sleep(0.02)


def test_malformed_bodies(server: RunningServer) -> None:
    status, answer = post_json(server, MUTATE, None, raw=b"{oops")
    assert status == 400 and "malformed AdmissionReview" in answer["error"]
    status, answer = post_json(
        server, VALIDATE, {"request": {"uid": "u9", "operation": "CREATE", "object": 5}}
    )
    assert status == 200 and answer["response"]["uid"] == "u9" and answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 400


def test_oversized_bodies_are_refused_unread(server: RunningServer) -> None:
    """Multi-tenant finding 6: no body limit, so one large request could OOM the webhook."""
    padding = "x" * (9 << 20)  # more than two etcd-sized objects
    big = json.dumps({"request": {"uid": "u1", "pad": padding}}).encode()
    try:
        status, _ = post_json(server, MUTATE, None, raw=big)
    except urllib.error.URLError as err:  # the server answered 413 and closed before the body was sent
        cut = isinstance(err.reason, ssl.SSLEOFError | ConnectionResetError | BrokenPipeError)
        status = 413 if cut else 0
    assert status == 413
    status, _answer = post_json(server, MUTATE, None, raw=b"{oops")  # and the server still answers
    assert status == 400


def cache_review(obj: Obj, operation: str = "CREATE", old: Obj | None = None) -> Obj:
    body = review_body(obj, operation, old)
    body["request"]["kind"] = {"group": names.GROUP, "version": names.VERSION, "kind": names.MODELCACHE_KIND}
    return body


def test_validate_modelcache_over_tls(server: RunningServer) -> None:
    good = modelcache("x", None, pvc=True)
    answer = admit(server, VALIDATE, cache_review(good))["response"]
    assert answer["allowed"] is True
    assert any("not a pinned commit" in w for w in answer["warnings"])
    missing = modelcache("x", None)
    missing["spec"]["storage"]["storageClassName"] = "gp3"
    refused = admit(server, VALIDATE, cache_review(missing))["response"]
    assert refused["allowed"] is False and "StorageClass 'gp3' does not exist" in refused["status"]["message"]
    selector = modelcache("x", None)
    selector["spec"]["nodeSelector"] = {"gpu": "h100"}
    warned = admit(server, VALIDATE, cache_review(selector))["response"]
    assert any("matches no nodes" in w for w in warned["warnings"])
    changed = modelcache("x", None)
    changed["spec"]["storage"]["size"] = "2Gi"
    immutable = admit(server, VALIDATE, cache_review(changed, "UPDATE", modelcache("x", None)))["response"]
    assert immutable["allowed"] is False and immutable["status"]["message"].startswith("spec.storage.size: ")


def test_node_decorator_over_http(server: RunningServer) -> None:
    golden = json.loads((Path(__file__).parent / "golden" / "node_labels_changed.json").read_text())
    status, answer = post_json(server, "/hooks/node/sync", golden["syncRequest"])
    assert status == 200 and answer == golden["syncResponse"]
    status, answer = post_json(server, "/hooks/node/customize", golden["customizeRequest"])
    assert status == 200 and answer == golden["customizeResponse"]


def test_unreachable_api_refuses_annotated_pods_only(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound but not listening: every connection is refused
        env = {
            **server_env(tmp_path, f"http://127.0.0.1:{sock.getsockname()[1]}", "unused"),
            "PRAESTO_LOOKUP_COLD_WAIT": "0.3",
        }
        with hooks_server(tmp_path, tls=True, env=env) as dead:
            refused = admit(dead, MUTATE, review_body(pod(mounts(("local-ready", "/m")))))["response"]
            assert refused["allowed"] is False and refused["status"]["code"] == 503
            message = refused["status"]["message"]
            assert f"Praesto could not read ModelCache {NS}/local-ready from the Kubernetes API" in message
            assert message.endswith("retry, or check the praesto-hooks logs")
            assert admit(dead, MUTATE, review_body(pod()))["response"]["allowed"] is True
