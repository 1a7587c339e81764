"""PVC mode's live progress in the sync hook: the Job's annotation -> status.progress, and the grant.

The annotation is written by a Pod a tenant influences: these tests feed it what such a Pod could
write (malformed, huge, lying) and check that the status shows only bounded, recomputed numbers.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from praesto.hooks import hook_protocol, pvc_progress
from praesto.hooks.config import HooksConfig
from praesto.hooks.modelcache import sync

from praesto import jobprogress, names, progress
from praesto.credscope import CredentialScope
from praesto.quantity import parse_quantity
from testkit.hook_objects import NOW, SEED_PVC_SPEC, job, modelcache, pvc, sync_request

CACHE = "live"
LIMIT = parse_quantity(SEED_PVC_SPEC["storage"]["size"])  # 5Gi: no honest report is larger
CONFIG = HooksConfig(downloader_image="ghcr.io/praesto/praesto:test")
Obj = dict[str, Any]


def report(done: int, total: int, rate: float | None, age: float = 0.0) -> str:
    return jobprogress.encode(done, total, rate, NOW - timedelta(seconds=age))


def running_job(annotation: Any = None, account: str | None = None) -> Obj:
    made = job(CACHE)
    if annotation is not None:
        made["metadata"]["annotations"] = {names.ANNOTATION_DOWNLOAD_PROGRESS: annotation}
    if account:
        made["spec"]["template"] = {"spec": {"serviceAccountName": account}}
    return made


def synced(made: Obj, config: HooksConfig = CONFIG) -> Obj:
    parent = modelcache(CACHE, dict(SEED_PVC_SPEC))
    response: Obj = sync(sync_request(parent, children=[pvc(CACHE), made]), config, NOW)
    hook_protocol.check_response("sync", response)
    return response


def test_a_fresh_report_shows_rate_time_left_and_summary() -> None:
    gib = 2**30
    response = synced(running_job(report(gib, 4 * gib, 32 * 2**20)))
    assert response["status"]["phase"] == names.PHASE_DOWNLOADING
    assert response["status"]["progress"] == {
        progress.BYTES_DONE: gib,
        progress.BYTES_TOTAL: 4 * gib,
        progress.BYTES_PER_SECOND: 32 * 2**20,
        progress.ETA_SECONDS: 96,
        progress.SUMMARY: "25% of 4.0 GiB, ~2m left",
    }
    # a writer that goes quiet loses its rate: the hook looks again once the report would be stale
    assert response["resyncAfterSeconds"] <= jobprogress.STALE_SECONDS


def test_a_stale_report_keeps_its_counts_but_shows_no_rate() -> None:
    status = synced(running_job(report(100, 400, 10.0, age=jobprogress.STALE_SECONDS + 1)))["status"]
    assert status["progress"] == {
        progress.BYTES_DONE: 100,
        progress.BYTES_TOTAL: 400,
        progress.SUMMARY: "25% of 400 B",
    }


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        "[1, 2]",
        json.dumps({"bytesDone": "1", "bytesTotal": 10}),
        json.dumps({"bytesDone": True, "bytesTotal": 10}),
        json.dumps({"bytesDone": 1}),
        json.dumps({"bytesDone": 1, "bytesTotal": 0}),
        json.dumps({"bytesDone": 1, "bytesTotal": float("nan")}),
        json.dumps({"bytesDone": 1, "bytesTotal": 10, "pad": "x" * jobprogress.MAX_CHARS}),  # too long
        "",
    ],
)
def test_a_malformed_report_is_ignored(value: str) -> None:
    status = synced(running_job(value))["status"]
    assert status["phase"] == names.PHASE_DOWNLOADING and "progress" not in status


def test_a_lying_report_is_clamped_and_its_time_left_recomputed() -> None:
    lie = json.dumps(
        {
            "bytesDone": 10**30,
            "bytesTotal": 10**30,
            "bytesPerSecond": 10**30,
            "etaSeconds": -5,
            jobprogress.UPDATED_AT: NOW.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )
    got = synced(running_job(lie))["status"]["progress"]
    assert got[progress.BYTES_TOTAL] == LIMIT and got[progress.BYTES_DONE] == LIMIT
    assert got[progress.ETA_SECONDS] == 0  # nothing left, whatever the writer said
    assert got[progress.SUMMARY] == "100% of 5.0 GiB"
    half = json.loads(report(LIMIT // 2, LIMIT * 4, float(10**30)))
    got = synced(running_job(json.dumps(half)))["status"]["progress"]
    assert got[progress.BYTES_PER_SECOND] == jobprogress.MAX_RATE
    assert got[progress.ETA_SECONDS] == 1  # recomputed from the clamped numbers, never the writer's


def test_the_future_is_not_fresh() -> None:
    status = synced(running_job(report(1, 4, 1.0, age=-(jobprogress.STALE_SECONDS + 1))))["status"]
    assert progress.BYTES_PER_SECOND not in status["progress"]


def test_the_grant_is_patch_on_the_one_job_to_the_account_the_job_runs_as() -> None:
    children = synced(running_job())["children"]
    role = next(c for c in children if c["kind"] == "Role")
    binding = next(c for c in children if c["kind"] == "RoleBinding")
    assert role["rules"] == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": [names.download_job_name(CACHE)],
         "verbs": ["patch"]}
    ]  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "default", "namespace": "default"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == names.download_progress_role_name(CACHE)
    # the chart's identity changed after the Job was made: the grant follows the Job, whose Pods keep
    # running as the account it was created with (and the chart's policy confines that account)
    identity = HooksConfig(
        downloader_image="x", downloader_service_account="praesto-downloader",
        credential_scope=CredentialScope(("default",)),
    )  # fmt: skip
    old = synced(running_job(), identity)["children"]
    assert next(c for c in old if c["kind"] == "RoleBinding")["subjects"][0]["name"] == "default"
    made = synced(running_job(account="praesto-downloader"), CONFIG)["children"]
    assert next(c for c in made if c["kind"] == "RoleBinding")["subjects"][0]["name"] == "praesto-downloader"


def test_no_grant_and_no_rate_once_the_job_ended() -> None:
    done = job(CACHE, conditions=[{"type": "Complete", "status": "True"}], active=0, succeeded=1)
    done["metadata"]["annotations"] = {names.ANNOTATION_DOWNLOAD_PROGRESS: report(5, 10, 1.0)}
    response = synced(done)
    assert response["status"]["phase"] == names.PHASE_READY
    assert {c["kind"] for c in response["children"]} == {"PersistentVolumeClaim", "Job"}
    assert "progress" not in response["status"]  # no termination message in this request: no size known


def test_only_the_download_container_gets_the_token() -> None:
    made = next(c for c in synced(running_job())["children"] if c["kind"] == "Job")
    pod = made["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (volume,) = (v for v in pod["volumes"] if v["name"] == pvc_progress.VOLUME)
    token = volume["projected"]["sources"][0]["serviceAccountToken"]
    assert token == {"path": "token", "expirationSeconds": 600}  # no audience: the API server's own
    (container,) = pod["containers"]
    assert {"name": pvc_progress.VOLUME, "mountPath": names.PROGRESS_CREDENTIALS_DIR, "readOnly": True} in (
        container["volumeMounts"]
    )
    assert {"name": names.ENV_PROGRESS_JOB, "value": f"default/{names.download_job_name(CACHE)}"} in (
        container["env"]
    )
