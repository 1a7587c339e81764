"""Issue 12, finding 4: a ModelCache author cannot pick the downloader's image.

(Naming a Secret the author cannot read is refused by the API server itself, the
chart's ValidatingAdmissionPolicy: tests/cluster/test_secret_access.py.) The
webhook refuses, with the field, the cause and the fix; the sync hook never
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
from testkit.admission_objects import NS, Obj
from testkit.hook_objects import sync_request

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


def pvc_spec(image: str | None) -> Obj:
    spec = hf_spec(storage={"size": "5Gi", "storageClassName": "nfs-rwx"})
    if image is not None:
        spec["downloader"] = {"image": image}
    return spec


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
