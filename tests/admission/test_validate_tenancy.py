"""Issue 12, finding 4: a ModelCache author cannot borrow a Secret or pick the downloader's image.

The webhook refuses, with the field, the cause and the fix; the sync hook never
emits a Job with an image outside the allow-list even when the webhook was
bypassed (failurePolicy Ignore, or created before the webhook existed).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from praesto.hooks.admission import review
from praesto.hooks.admission.lookup import StaticLookups
from praesto.hooks.admission.validate import validate
from praesto.hooks.config import HooksConfig
from praesto.hooks.modelcache import HOOKS

from praesto import names
from tests.hooks.factory import sync_request

from .podkit import NS, Obj
from .test_validate_logic import cache, hf_spec

CONFIG = HooksConfig(
    downloader_image="ghcr.io/praesto/praesto:1.0",
    allowed_downloader_images=("registry.corp.example/praesto:2.0", "registry.corp.example/mirror/*"),
)
USER = {"username": "alice", "uid": "a-1", "groups": ["team-a"], "extra": {"scopes": ["x"]}}


def run(obj: Obj, lookups: StaticLookups, user: dict[str, Any] = USER) -> Obj:
    body = {
        "apiVersion": review.API_VERSION,
        "kind": review.KIND,
        "request": {"uid": "u", "operation": "CREATE", "namespace": NS, "object": obj, "userInfo": user},
    }
    return validate(review.parse_review(body), lookups, CONFIG)


def with_token(secret: str) -> Obj:
    source = {
        "huggingface": {"repo": "org/model", "token": {"secretRef": {"name": secret, "key": "HF_TOKEN"}}}
    }
    return hf_spec(source=source)


def pvc_spec(image: str | None) -> Obj:
    spec = hf_spec(storage={"size": "5Gi", "storageClassName": "nfs-rwx"})
    if image is not None:
        spec["downloader"] = {"image": image}
    return spec


def test_naming_a_secret_the_author_cannot_read_is_refused() -> None:
    # The attack: a user without Secret read names prod-db-password, which Praesto would
    # mount into the downloader and send as HF_TOKEN to a URL of their choosing.
    lookups = StaticLookups(storageclasses={"nfs-rwx"}, secrets_denied={("alice", NS, "prod-db-password")})
    status = run(cache(with_token("prod-db-password")), lookups)["response"]
    assert status["allowed"] is False
    message = status["status"]["message"]
    assert message.startswith("spec.source.huggingface.token.secretRef.name: alice may not get Secret")
    assert "'prod-db-password'" in message and f"get` on secrets/prod-db-password in {NS}" in message
    assert status["status"]["code"] == 403


def test_a_readable_secret_is_allowed_and_the_credentials_form_names_its_own_field() -> None:
    lookups = StaticLookups(secrets_denied={("bob", NS, "hf")})
    assert run(cache(with_token("hf")), lookups)["response"]["allowed"] is True
    s3 = {"source": {"uri": "s3://bucket/prefix", "secretRef": {"name": "aws"}}, "storage": {"size": "1Gi"}}
    denied = StaticLookups(secrets_denied={("alice", NS, "aws")})
    message = run(cache(s3), denied)["response"]["status"]["message"]
    assert message.startswith("spec.source.secretRef.name: alice may not get Secret 'aws'")


def test_when_access_cannot_be_checked_the_cache_is_refused_as_retryable() -> None:
    status = run(cache(with_token("hf")), StaticLookups(unavailable="API server unreachable"))["response"]
    assert status["allowed"] is False and status["status"]["code"] == 503
    assert (
        "could not check that you may read Secret hf: API server unreachable" in status["status"]["message"]
    )


def test_user_info_reaches_the_access_check_whole() -> None:
    seen: list[review.UserInfo] = []

    class Recording(StaticLookups):
        def may_get_secret(self, user: review.UserInfo, namespace: str, name: str) -> bool:
            seen.append(user)
            return True

    run(cache(with_token("hf")), Recording())
    assert seen == [review.UserInfo("alice", "a-1", ("team-a",), {"scopes": ["x"]})]


def test_downloader_images_outside_the_allow_list_are_refused() -> None:
    lookups = StaticLookups(storageclasses={"nfs-rwx"})
    refused = run(cache(pvc_spec("attacker.example/evil:latest")), lookups)["response"]
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    message = refused["status"]["message"]
    assert message.startswith("spec.downloader.image: image 'attacker.example/evil:latest' is not in the")
    assert "downloader.allowedImages" in message
    # A prefix entry must not match a look-alike registry path.
    lookalike = run(cache(pvc_spec("registry.corp.example/mirror-evil/x:1")), lookups)["response"]
    assert lookalike["allowed"] is False
    for image in (
        None,
        CONFIG.downloader_image,
        "registry.corp.example/praesto:2.0",
        "registry.corp.example/mirror/x:1",
    ):
        assert run(cache(pvc_spec(image)), lookups)["response"]["allowed"] is True, image


def test_the_sync_hook_never_emits_a_job_with_an_image_outside_the_allow_list() -> None:
    parent = cache(pvc_spec("attacker.example/evil:latest"))
    parent["metadata"].update({"uid": "uid-1", "generation": 1})
    response = HOOKS["sync"](sync_request(parent), CONFIG, datetime(2026, 12, 1, tzinfo=UTC))
    assert response["children"] == []  # issue 21 item 16: no children, not even the volume
    status = response["status"]
    assert status["phase"] == names.PHASE_FAILED and "downloadJobName" not in status
    ready = status["conditions"][0]
    assert ready["reason"] == "DownloaderImageNotAllowed"
    assert ready["message"].startswith("spec.downloader.image: image 'attacker.example/evil:latest'")
