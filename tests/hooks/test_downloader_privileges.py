"""A ModelCache author cannot make the PVC-mode download Job privileged (multi-tenant finding 4)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from praesto.hooks import hook_protocol, modelcache
from praesto.hooks.admission import review
from praesto.hooks.admission.lookup import StaticLookups
from praesto.hooks.admission.validate import validate
from praesto.hooks.pvc_job import _security_context

from testkit.hook_objects import NOW, SEED_PVC_SPEC, sync_request
from testkit.hook_objects import modelcache as mc
from tests.hooks.golden import CONFIG

RAISING = [
    {"privileged": True},
    {"allowPrivilegeEscalation": True},
    {"runAsUser": 0},
    {"runAsNonRoot": False},
    {"capabilities": {"add": ["SYS_ADMIN"]}},
    {"procMount": "Unmasked"},
    {"seLinuxOptions": {"type": "spc_t"}},
    {"seccompProfile": {"type": "Unconfined"}},
    {"windowsOptions": {"hostProcess": True}},
    # issue 21 item 18: merged over the restricted baseline, each of these undoes part of it
    {"allowPrivilegeEscalation": None},
    {"runAsNonRoot": None},
    {"capabilities": {"drop": []}},
    {"capabilities": {"drop": ["NET_RAW"]}},
    {"capabilities": None},
    {"seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/anything.json"}},
    {"seccompProfile": None},
    {"appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-anything"}},
    {"runAsUser": "1000"},
]


def spec_with(context: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(SEED_PVC_SPEC)
    spec["downloader"] = {"containerSecurityContext": context}
    return spec


@pytest.mark.parametrize("context", RAISING, ids=lambda c: next(iter(c)))
def test_the_sync_hook_emits_no_job_for_it(context: dict[str, Any]) -> None:
    response = modelcache.sync(sync_request(mc("evil", spec_with(context))), CONFIG, NOW)
    assert hook_protocol.check_response("sync", response) == []
    assert not [c for c in response["children"] if c["kind"] == "Job"]
    ready = next(c for c in response["status"]["conditions"] if c["type"] == "Ready")
    assert (
        ready["reason"] == "InvalidSpec"
        and f"spec.downloader.containerSecurityContext.{next(iter(context))}" in ready["message"]
    )


@pytest.mark.parametrize("context", RAISING, ids=lambda c: next(iter(c)))
def test_the_validating_webhook_refuses_it_naming_the_field(context: dict[str, Any]) -> None:
    body = {
        "apiVersion": review.API_VERSION,
        "kind": review.KIND,
        "request": {
            "uid": "u",
            "operation": "CREATE",
            "namespace": "default",
            "object": mc("evil", spec_with(context)),
        },
    }
    answer = validate(review.parse_review(body), StaticLookups(storageclasses={"rwx-storage-class"}))
    assert answer["response"]["allowed"] is False
    assert f"containerSecurityContext.{next(iter(context))}" in answer["response"]["status"]["message"]


@pytest.mark.parametrize(
    "context",
    [
        {"allowPrivilegeEscalation": False, "privileged": False, "runAsNonRoot": True},
        {"runAsUser": 1000, "runAsGroup": 1000, "readOnlyRootFilesystem": False, "procMount": "Default"},
        {"capabilities": {"drop": ["ALL", "NET_RAW"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        {"appArmorProfile": {"type": "RuntimeDefault"}},
    ],
)
def test_what_keeps_the_container_restricted_is_accepted(context: dict[str, Any]) -> None:
    response = modelcache.sync(sync_request(mc("fine", spec_with(context))), CONFIG, NOW)
    [job] = [c for c in response["children"] if c["kind"] == "Job"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"].items() >= context.items()


def test_tightening_is_kept_and_raising_never_reaches_the_job() -> None:
    tight = _security_context({"runAsUser": 1000, "readOnlyRootFilesystem": True})
    assert tight["runAsUser"] == 1000 and tight["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in _security_context({"privileged": True})
    assert _security_context({"capabilities": {"add": ["NET_ADMIN"]}})["capabilities"] == {"drop": ["ALL"]}
    assert _security_context({"allowPrivilegeEscalation": None})["allowPrivilegeEscalation"] is False
