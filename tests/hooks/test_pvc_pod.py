"""PVC mode reads its download Pod: why it cannot start (one sync), and what it downloaded."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from praesto.hooks import hook_protocol, modelcache
from praesto.hooks.pvc_pod import JOB_NAME_LABEL

from praesto import names
from praesto.credscope import CredentialScope
from testkit.hook_objects import NOW, consumer, customize_request, job, pvc, sync_request
from tests.hooks.golden import CONFIG
from tests.hooks.scenarios import RWX, _pvc_parent

Obj = dict[str, Any]
IDENTITY = replace(
    CONFIG,
    downloader_service_account="praesto-downloader",
    credential_scope=CredentialScope(namespaces=("default",)),  # the namespace these caches live in
)


def job_pod(*, waiting: Obj | None = None, terminated: Obj | None = None) -> Obj:
    state: Obj = (
        {"waiting": waiting} if waiting else {"terminated": terminated} if terminated else {"running": {}}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "praesto-download-x-abcde",
            "namespace": "default",
            "creationTimestamp": "2026-12-01T12:00:00Z",
            "labels": {JOB_NAME_LABEL: names.download_job_name(RWX)},
        },
        "status": {"containerStatuses": [{"name": "download", "state": state}]},
    }


def sync(
    *pods: Obj, children: list[Obj] | None = None, config: Any = CONFIG, accounts: list[Obj] | None = None
) -> Obj:
    request = sync_request(_pvc_parent(), pods=list(pods), children=children or [pvc(RWX, "Bound"), job(RWX)])
    if accounts is not None:
        request["related"][hook_protocol.SERVICE_ACCOUNT] = {
            f"default/{a['metadata']['name']}": a for a in accounts
        }
    response = modelcache.sync(request, config, NOW)
    assert hook_protocol.check_response("sync", response) == []
    status: Obj = response["status"]
    return status


def ready(status: Obj) -> Obj:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_customize_relates_the_job_pods_and_with_identity_the_service_account() -> None:
    rules = modelcache.customize(customize_request(_pvc_parent()), IDENTITY, NOW)["relatedResources"]
    assert {"apiVersion": "v1", "resource": "pods", "namespace": "default",
            "labelSelector": {"matchLabels": {JOB_NAME_LABEL: names.download_job_name(RWX)}}} in rules  # fmt: skip
    assert {"apiVersion": "v1", "resource": "serviceaccounts", "namespace": "default",
            "names": ["praesto-downloader"]} in rules  # fmt: skip
    plain = modelcache.customize(customize_request(_pvc_parent()), CONFIG, NOW)["relatedResources"]
    assert not any(r["resource"] == "serviceaccounts" for r in plain)


def test_a_pod_that_cannot_start_is_pending_with_the_kubelets_reason() -> None:
    status = sync(job_pod(waiting={"reason": "ErrImagePull", "message": "pull access denied for evil/image"}))
    assert status["phase"] == names.PHASE_PENDING
    assert ready(status)["reason"] == "ErrImagePull" and "pull access denied" in ready(status)["message"]
    assert sync(job_pod())["phase"] == names.PHASE_DOWNLOADING  # running: nothing to say


def test_a_missing_downloader_service_account_is_named() -> None:
    status = sync(config=IDENTITY, accounts=[])
    assert ready(status)["reason"] == "WaitingForServiceAccount"
    assert "default/praesto-downloader" in ready(status)["message"]
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "praesto-downloader", "namespace": "default"},
    }
    assert sync(config=IDENTITY, accounts=[account])["phase"] == names.PHASE_DOWNLOADING


def test_the_downloaders_report_gives_commit_and_real_size() -> None:
    done = job(RWX, [{"type": "Complete", "status": "True"}], active=0, succeeded=1)
    message = json.dumps({"resolvedRevision": "a" * 40, "sizeBytes": 1234})
    status = sync(job_pod(terminated={"exitCode": 0, "message": message}), children=[pvc(RWX), done])
    assert (status["phase"], status["resolvedRevision"], status["sizeBytes"]) == (
        names.PHASE_READY,
        "a" * 40,
        1234,
    )
    assert status["progress"]["summary"] == "100% of 1.2 KiB"
    garbage = sync(
        job_pod(terminated={"exitCode": 0, "message": "log tail, not JSON"}), children=[pvc(RWX), done]
    )
    assert garbage["phase"] == names.PHASE_READY and "resolvedRevision" not in garbage


def test_the_download_pod_is_not_a_consumer() -> None:
    in_use = sync(consumer(RWX, "server", "node-a"))
    only_download = sync(job_pod())
    assert "lastUsedTime" in in_use and "lastUsedTime" not in only_download
