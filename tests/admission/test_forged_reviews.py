"""Forged AdmissionReviews learn nothing about another namespace (#21 item 15).

With the chart defaults (no webhooks.clientAuth) praesto-hooks cannot tell the API server from
any Pod that connects, and a review can claim any namespace and user. Before the fix, a forged
review read the victim's cache phase, progress and failure text from the Pod answer, and its
quota, bytes used and cache count from the ModelCache answer; a nodeSelector on another
namespace's ready label said whether that cache was Ready on some node. Here a real
`praesto-hooks` over TLS, its lookups fed by the real API server
(as the hooks' own ServiceAccount), is asked exactly that.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from praesto import names
from testkit.admission_objects import Obj, modelcache, mounts, pod, review_body
from testkit.controlplane import ControlPlane
from testkit.kube_real import RealKube, proxied
from testkit.pki import CertificateAuthority
from testkit.server import CertifiedClient, RunningServer, hooks_server, post_json

from .test_admission_server import MUTATE, VALIDATE, hooks_token, server_env

VICTIM = "victim"
FAILURE = "AccessDenied: s3://victim-private/weights is not readable by role victim-prod"
DONE, TOTAL = 123456789, 987654321
GiB = 2**30
QUOTAS = {"default": "", "namespaces": {VICTIM: "10Gi"}}
SECRETS = (
    FAILURE,
    "victim-private",
    "AccessDenied",
    str(DONE),
    str(TOTAL),
    "%",
    *names.PHASES,
    "10.0 GiB",
    str(10 * GiB),
    "7.0 GiB",
    str(7 * GiB),
    "quota",
    "matches no nodes",
)


def _caches() -> list[Obj]:
    failed = modelcache("weights", names.PHASE_FAILED, namespace=VICTIM, message=FAILURE)
    failed["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "AccessDenied",
                                       "message": FAILURE}]  # fmt: skip
    progress = {"bytesDone": DONE, "bytesTotal": TOTAL}
    downloading = modelcache("llama", names.PHASE_DOWNLOADING, namespace=VICTIM, progress=progress)
    shared = modelcache("shared", names.PHASE_DOWNLOADING, pvc=True, namespace=VICTIM, progress=progress)
    big = modelcache("big", names.PHASE_READY, namespace=VICTIM)
    big["spec"]["storage"]["size"] = "4Gi"  # with the others (1Gi each): 7Gi of the 10Gi quota used
    return [failed, downloading, shared, big]


@pytest.fixture(scope="module")
def api(kube_plane: ControlPlane) -> Iterator[RealKube]:
    with proxied(kube_plane) as real:
        for cache in _caches():
            real.create(cache, with_status=True)
        real.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {
            names.ready_label_key(VICTIM, "llama"): "true"}}})  # fmt: skip
        yield real


@pytest.fixture(scope="module")
def forged(api: RealKube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The chart's default: no client CA, so every caller is unverified."""
    directory = tmp_path_factory.mktemp("forged")
    env = {**server_env(directory, api.url, hooks_token(api)), "PRAESTO_NAMESPACE_QUOTAS": json.dumps(QUOTAS)}
    with hooks_server(directory, tls=True, env=env, workers=1, threads=2) as running:
        yield running


def _claiming_victim(obj: Obj, user: str = "system:admin") -> Obj:
    obj["metadata"]["namespace"] = VICTIM
    body = review_body(obj)
    body["request"]["namespace"] = VICTIM
    body["request"]["userInfo"] = {"username": user, "groups": ["system:masters"]}
    return body


def _answer(server: RunningServer, path: str, body: Obj) -> Obj:
    status, answer = post_json(server, path, body)
    assert status == 200, answer
    response: Obj = answer["response"]
    return response


def _assert_says_nothing(response: Any) -> None:
    text = json.dumps(response)
    leaked = [secret for secret in SECRETS if secret in text]
    assert not leaked, f"a forged review learned {leaked}: {text}"


@pytest.mark.parametrize("cache", ["weights", "llama", "shared", "big", "absent"])
def test_a_forged_pod_review_learns_no_cache_state(forged: RunningServer, cache: str) -> None:
    response = _answer(forged, MUTATE, _claiming_victim(pod(mounts((cache, "/models")))))
    _assert_says_nothing(response)
    assert "warnings" not in response
    if cache in ("weights", "absent"):  # a failed cache and a missing one: one refusal, word for word
        assert response["status"]["message"] == (
            f"metadata.annotations[{names.ANNOTATION_MODEL_MOUNTS}][0]: ModelCache {cache!r} does not exist "
            f"in namespace {VICTIM} or cannot be used; check its name and status: "
            f"kubectl describe modelcache {cache} -n {VICTIM}"
        )
    else:
        assert response["allowed"] is True and response["patch"]


def test_a_forged_modelcache_review_learns_no_quota(forged: RunningServer) -> None:
    over = modelcache("more", None, namespace=VICTIM)
    over["spec"]["storage"]["size"] = "5Gi"  # 7Gi used + 5Gi > 10Gi: the sync hook refuses it, not this
    response = _answer(forged, VALIDATE, _claiming_victim_cache(over))
    _assert_says_nothing(response)
    assert response["allowed"] is True


def test_a_forged_node_selector_learns_no_placement(forged: RunningServer) -> None:
    for key in (names.ready_label_key(VICTIM, "llama"), "gpu"):
        probe = modelcache("probe", None, namespace=VICTIM)
        probe["spec"]["nodeSelector"] = {key: "true"}
        response = _answer(forged, VALIDATE, _claiming_victim_cache(probe))
        _assert_says_nothing(response)
        assert not any("nodeSelector" in w for w in response.get("warnings", []))


def test_the_answer_does_not_depend_on_the_claimed_user(forged: RunningServer) -> None:
    """No "may user X read Secret Y" oracle: the Secret check is the API server's own policy."""
    answers = []
    for user in ("system:admin", "system:serviceaccount:victim:nobody"):
        cache = modelcache("secret-probe", None, namespace=VICTIM)
        cache["spec"]["source"]["secretRef"] = {"name": "hf-token"}
        answers.append(_answer(forged, VALIDATE, _claiming_victim_cache(cache, user)))
    assert answers[0] == answers[1]


def test_the_api_server_with_its_certificate_still_gets_the_details(
    api: RealKube, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """webhooks.clientAuth: the verified caller is the API server, answers describe the cache."""
    directory = tmp_path_factory.mktemp("verified")
    client_ca = CertificateAuthority(directory / "client-pki", "webhook-client-ca")
    pair = client_ca.issue("apiserver", common_name="kube-apiserver", client=True)
    env = {**server_env(directory, api.url, hooks_token(api)), "PRAESTO_NAMESPACE_QUOTAS": json.dumps(QUOTAS)}
    args = ("--client-ca-file", str(client_ca.cert_path))
    with hooks_server(directory, tls=True, env=env, workers=1, threads=2, extra_args=args) as running:
        status, _ = post_json(running, MUTATE, _claiming_victim(pod(mounts(("weights", "/m")))))
        assert status == 403  # no certificate: no answer at all
        api_server = CertifiedClient.of(running, pair.cert_path, pair.key_path)
        failed = _answer(api_server, MUTATE, _claiming_victim(pod(mounts(("weights", "/m")))))
        assert FAILURE in failed["status"]["message"]
        over = modelcache("more", None, namespace=VICTIM)
        over["spec"]["storage"]["size"] = "5Gi"
        quota = _answer(api_server, VALIDATE, _claiming_victim_cache(over))
        assert quota["allowed"] is False and f"({7 * GiB} bytes) is used" in quota["status"]["message"]


def _claiming_victim_cache(obj: Obj, user: str = "system:admin") -> Obj:
    body = _claiming_victim(obj, user)
    body["request"]["kind"] = {"group": names.GROUP, "version": names.VERSION, "kind": names.MODELCACHE_KIND}
    body["request"]["resource"] = {"group": names.GROUP, "version": names.VERSION, "resource": "modelcaches"}
    return body
