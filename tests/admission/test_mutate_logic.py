"""Mutating webhook logic, in process, with in-memory lookups (the server tests use the real client)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from praesto.hooks.admission import review
from praesto.hooks.admission.annotations import MAX_MOUNTS
from praesto.hooks.admission.lookup import StaticLookups
from praesto.hooks.admission.mutate import mutate

from praesto import names
from testkit.admission_objects import (
    IMAGE,
    NS,
    Obj,
    apply_and_validate,
    denial,
    modelcache,
    mounts,
    patch_of,
    pod,
    request_of,
    static_lookups,
)

LOOKUPS = static_lookups()


def run(obj: Obj, lookups: StaticLookups = LOOKUPS, operation: str = "CREATE") -> Obj:
    return mutate(request_of(obj, operation), lookups, IMAGE)


def ready_expr(cache: str) -> Obj:
    return {"key": names.ready_label_key(NS, cache), "operator": "In", "values": ["true"]}


def test_pod_without_annotations_is_allowed_untouched() -> None:
    for obj in (pod(), pod({"other": "x"})):
        response = run(obj)
        assert response["response"] == {"uid": "uid-1", "allowed": True}


def test_only_create_is_mutated() -> None:
    response = run(pod(mounts(("local-ready", "/models"))), operation="UPDATE")
    assert response["response"] == {"uid": "uid-1", "allowed": True}


@pytest.mark.parametrize("phase", ["new", "pending", "downloading", "ready", "evicted"])
def test_local_cache_gets_readonly_inline_csi_volume(phase: str) -> None:
    obj = pod(mounts((f"local-{phase}", "/models/llm/")))
    response = run(obj)
    patched = apply_and_validate(obj, response)
    cache = f"local-{phase}"
    assert patched["spec"]["volumes"] == [
        {
            "name": f"praesto-{cache}",
            "csi": {
                "driver": "csi.praesto.io",
                "readOnly": True,
                "volumeAttributes": {"modelCacheName": cache},
            },
        }
    ]
    assert patched["spec"]["containers"][0]["volumeMounts"] == [
        {"name": f"praesto-{cache}", "mountPath": "/models/llm", "readOnly": True}
    ]
    assert patched["metadata"]["labels"] == {
        "praesto.io/uses-model-cache": "true",
        f"consumer.praesto.io/{cache}": "true",
    }
    preferred = patched["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [{"weight": 50, "preference": {"matchExpressions": [ready_expr(cache)]}}]
    assert "initContainers" not in patched["spec"]
    warnings = response["response"].get("warnings", [])
    assert (phase == "ready") == (warnings == [])


@pytest.mark.parametrize("phase", ["new", "pending", "downloading", "ready", "evicted"])
def test_pvc_cache_gets_readonly_claim_and_wait_init_container(phase: str) -> None:
    cache = f"pvc-{phase}"
    obj = pod(mounts((cache, "/data")), initContainers=[{"name": "setup", "image": "busybox"}])
    patched = apply_and_validate(obj, run(obj))
    volume = {
        "name": f"praesto-{cache}",
        "persistentVolumeClaim": {"claimName": f"praesto-{cache}", "readOnly": True},
    }
    assert patched["spec"]["volumes"] == [volume]
    setup, wait = patched["spec"]["initContainers"]
    assert setup == {"name": "setup", "image": "busybox"}  # existing init containers untouched, ours last
    assert wait["image"] == IMAGE
    assert wait["command"] == ["praesto-agent", "wait", "--path", "/data"]
    assert wait["volumeMounts"] == [{"name": f"praesto-{cache}", "mountPath": "/data", "readOnly": True}]
    security = wait["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert "affinity" not in patched["spec"]  # a RWX claim is reachable from every node


def test_status_pvc_name_is_used_when_present() -> None:
    lookups = StaticLookups(
        modelcaches={(NS, "m"): modelcache("m", "Ready", pvc=True, pvcName="custom-claim")}
    )
    patched = apply_and_validate(obj := pod(mounts(("m", "/m"))), run(obj, lookups))
    assert patched["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "custom-claim"


@pytest.mark.parametrize("mode", ["local", "pvc"])
def test_failed_cache_is_refused_with_its_own_message(mode: str) -> None:
    code, message = denial(run(pod(mounts((f"{mode}-failed", "/m")))))
    assert code == 403
    assert (
        f"ModelCache {NS}/{mode}-failed has failed: RepoNotFound: org/model does not exist on the Hub"
        in message
    )
    assert message.startswith(f"metadata.annotations[{names.ANNOTATION_MODEL_MOUNTS}][0]")
    assert "kubectl describe modelcache" in message


def test_failed_cache_without_conditions_uses_status_message() -> None:
    lookups = StaticLookups(
        modelcaches={(NS, "m"): modelcache("m", "Failed", message="disk full on node n1")}
    )
    assert "disk full on node n1" in denial(run(pod(mounts(("m", "/m"))), lookups))[1]


def test_unknown_cache_is_refused() -> None:
    code, message = denial(run(pod(mounts(("nope", "/m")))))
    assert code == 403
    assert f"ModelCache 'nope' does not exist in namespace {NS}" in message


def test_cache_in_another_namespace_is_not_visible() -> None:
    lookups = StaticLookups(modelcaches={("other", "m"): modelcache("m", "Ready", namespace="other")})
    assert "does not exist in namespace" in denial(run(pod(mounts(("m", "/m"))), lookups))[1]


def test_unreachable_api_refuses_with_retry_advice() -> None:
    lookups = StaticLookups(unavailable="connection refused")
    code, message = denial(run(pod(mounts(("local-ready", "/m"))), lookups))
    assert code == 503
    assert (
        f"Praesto could not read ModelCache {NS}/local-ready from the Kubernetes API: connection refused; "
        "retry, or check the praesto-hooks logs" in message
    )


MOUNTS = f"metadata.annotations[{names.ANNOTATION_MODEL_MOUNTS}]"
REFUSALS: list[tuple[str, dict[str, str], str]] = [
    ("not json", {names.ANNOTATION_MODEL_MOUNTS: "[{"}, f"{MOUNTS}: is not valid JSON"),
    (
        "object not list",
        {names.ANNOTATION_MODEL_MOUNTS: '{"modelCache": "a"}'},
        "must be a non-empty JSON list",
    ),
    ("empty list", {names.ANNOTATION_MODEL_MOUNTS: "[]"}, "must be a non-empty JSON list"),
    ("item not object", {names.ANNOTATION_MODEL_MOUNTS: '["a"]'}, f"{MOUNTS}[0]: must be an object"),
    (
        "unknown key",
        {names.ANNOTATION_MODEL_MOUNTS: '[{"modelCache": "local-ready", "mountpath": "/m"}]'},
        "unknown key(s) mountpath",
    ),
    (
        "missing path",
        {names.ANNOTATION_MODEL_MOUNTS: '[{"modelCache": "local-ready"}]'},
        f"{MOUNTS}[0].mountPath: mountPath must be a non-empty string",
    ),
    ("bad cache name", mounts(("Local_Ready", "/m")), "'Local_Ready' is not a valid ModelCache name"),
    ("relative", mounts(("local-ready", "models")), "mountPath 'models' is relative; use an absolute path"),
    ("dotdot", mounts(("local-ready", "/models/../etc")), "contains '..'"),
    ("root", mounts(("local-ready", "/")), "mountPath '/' would hide"),
    ("root slashes", mounts(("local-ready", "//./")), "mountPath '/' would hide"),
    ("duplicate", mounts(("local-ready", "/m"), ("pvc-ready", "/m/")), "[1].mountPath: /m duplicates /m"),
    ("nested", mounts(("local-ready", "/m"), ("pvc-ready", "/m/x")), "/m/x is nested with /m"),
    ("same cache twice", mounts(("local-ready", "/a"), ("local-ready", "/b")), "is listed twice"),
    (
        "too many",
        mounts(*[(f"c{i}", f"/m{i}") for i in range(MAX_MOUNTS + 1)]),
        f"more than the limit of {MAX_MOUNTS}",
    ),
    (
        "mixed forms",
        {**mounts(("local-ready", "/m")), names.ANNOTATION_LEGACY_MODEL_CACHE: "local-ready"},
        "is set together with the legacy",
    ),
    (
        "legacy path alone",
        {names.ANNOTATION_LEGACY_MOUNT_PATH: "/m"},
        f"{names.ANNOTATION_LEGACY_MOUNT_PATH}]: is set without {names.ANNOTATION_LEGACY_MODEL_CACHE}",
    ),
    (
        "legacy relative",
        {names.ANNOTATION_LEGACY_MODEL_CACHE: "local-ready", names.ANNOTATION_LEGACY_MOUNT_PATH: "m"},
        "[praesto.io/model-mount-path]: mountPath 'm' is relative",
    ),
    (
        "target alone",
        {names.ANNOTATION_TARGET_CONTAINER: "app"},
        f"[{names.ANNOTATION_TARGET_CONTAINER}]: is set but no model is requested",
    ),
    (
        "unknown target",
        {**mounts(("local-ready", "/m")), names.ANNOTATION_TARGET_CONTAINER: "sidecar"},
        "container 'sidecar' is not in spec.containers; use one of: app",
    ),
    (
        "bad scheduling",
        {**mounts(("local-ready", "/m")), names.ANNOTATION_SCHEDULING: "required"},
        "'required' is not a scheduling mode; use one of Preferred, Required, None",
    ),
]


@pytest.mark.parametrize(
    ("annotations", "expected"), [(a, e) for _, a, e in REFUSALS], ids=[i for i, _, _ in REFUSALS]
)
def test_refusals_name_annotation_cause_and_fix(annotations: dict[str, str], expected: str) -> None:
    response = run(pod(annotations))
    code, message = denial(response)
    assert code == 400
    assert expected in message
    assert message.startswith("metadata.annotations[praesto.io/")
    assert "; " in message  # cause; fix


@pytest.mark.parametrize("path", ["/models", "/models/llm", "/srv"])
def test_collision_with_existing_volume_mount_is_refused(path: str) -> None:
    mounts_ = [{"name": "cache", "mountPath": "/models"}, {"name": "srv", "mountPath": "/srv/data/"}]
    container = {"name": "app", "image": "busybox", "volumeMounts": mounts_}
    volumes = [{"name": "cache", "emptyDir": {}}, {"name": "srv", "emptyDir": {}}]
    obj = pod(mounts(("local-ready", path)), containers=[container], volumes=volumes)
    code, message = denial(run(obj))
    assert code == 400
    assert message.startswith(
        f"metadata.annotations[{names.ANNOTATION_MODEL_MOUNTS}][0].mountPath: {path} collides"
    )
    existing = "'srv' at /srv/data/" if path == "/srv" else "'cache' at /models"
    assert f"collides with the container's volumeMount {existing}" in message


def test_mount_next_to_existing_volume_mount_is_fine() -> None:
    container = {
        "name": "app",
        "image": "busybox",
        "volumeMounts": [{"name": "cache", "mountPath": "/models"}],
    }
    obj = pod(
        mounts(("local-ready", "/models2")),
        containers=[container],
        volumes=[{"name": "cache", "emptyDir": {}}],
    )
    assert (
        apply_and_validate(obj, run(obj))["spec"]["containers"][0]["volumeMounts"][1]["mountPath"]
        == "/models2"
    )


def test_pod_with_existing_volumes_mounts_and_affinity_is_merged() -> None:
    anti: Obj = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    obj = pod(
        {**mounts(("local-ready", "/models")), names.ANNOTATION_TARGET_CONTAINER: "main"},
        containers=[
            {"name": "sidecar", "image": "busybox"},
            {
                "name": "main",
                "image": "busybox",
                "volumeMounts": [{"name": "praesto-local-ready", "mountPath": "/tmp"}],
            },
        ],
        volumes=[{"name": "praesto-local-ready", "emptyDir": {}}],
        affinity=anti,
        ephemeralContainers=[{"name": "debug", "image": "busybox"}],
    )
    obj["metadata"]["labels"] = {"app": "web"}
    response = run(obj)
    ops = patch_of(response)
    assert {op["op"] for op in ops} == {"add"}
    assert {"op": "add", "path": "/metadata/labels/praesto.io~1uses-model-cache", "value": "true"} in ops
    patched = apply_and_validate(obj, response)
    assert patched["metadata"]["labels"]["app"] == "web"
    assert [v["name"] for v in patched["spec"]["volumes"]] == ["praesto-local-ready", "praesto-local-ready-2"]
    assert patched["spec"]["containers"][0] == {"name": "sidecar", "image": "busybox"}
    assert patched["spec"]["containers"][1]["volumeMounts"][1] == {
        "name": "praesto-local-ready-2",
        "mountPath": "/models",
        "readOnly": True,
    }
    assert patched["spec"]["ephemeralContainers"] == obj["spec"]["ephemeralContainers"]
    assert patched["spec"]["affinity"]["podAntiAffinity"] == anti["podAntiAffinity"]
    assert "nodeAffinity" in patched["spec"]["affinity"]


def test_required_scheduling_is_anded_into_every_existing_term() -> None:
    terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    ]
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    annotations = {
        **mounts(("local-ready", "/a"), ("pvc-ready", "/b")),
        names.ANNOTATION_SCHEDULING: "Required",
    }
    obj = pod(annotations, affinity=copy.deepcopy(affinity))
    patched = apply_and_validate(obj, run(obj))
    got = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert got["nodeSelectorTerms"][0]["matchExpressions"] == [
        terms[0]["matchExpressions"][0],
        ready_expr("local-ready"),
    ]
    assert got["nodeSelectorTerms"][1]["matchExpressions"] == [ready_expr("local-ready")]
    assert got["nodeSelectorTerms"][1]["matchFields"] == terms[1]["matchFields"]


def test_required_scheduling_without_affinity_adds_one_term() -> None:
    obj = pod(
        {**mounts(("local-ready", "/a"), ("local-pending", "/b")), names.ANNOTATION_SCHEDULING: "Required"}
    )
    patched = apply_and_validate(obj, run(obj))
    required = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == {
        "nodeSelectorTerms": [{"matchExpressions": [ready_expr("local-ready"), ready_expr("local-pending")]}]
    }


def test_scheduling_none_adds_no_affinity() -> None:
    obj = pod({**mounts(("local-ready", "/a")), names.ANNOTATION_SCHEDULING: "None"})
    assert "affinity" not in apply_and_validate(obj, run(obj))["spec"]


def test_preferred_terms_append_to_existing_list() -> None:
    existing = {"weight": 1, "preference": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}}
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [existing]}}
    obj = pod(mounts(("local-ready", "/a")), affinity=affinity)
    patched = apply_and_validate(obj, run(obj))
    preferred = patched["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0] == existing and preferred[1]["preference"]["matchExpressions"] == [
        ready_expr("local-ready")
    ]


def test_legacy_annotations_default_to_models() -> None:
    obj = pod({names.ANNOTATION_LEGACY_MODEL_CACHE: "pvc-ready"})
    patched = apply_and_validate(obj, run(obj))
    assert patched["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == names.DEFAULT_MOUNT_PATH
    custom = pod(
        {names.ANNOTATION_LEGACY_MODEL_CACHE: "local-ready", names.ANNOTATION_LEGACY_MOUNT_PATH: "/w"}
    )
    assert (
        apply_and_validate(custom, run(custom))["spec"]["containers"][0]["volumeMounts"][0]["mountPath"]
        == "/w"
    )


@pytest.mark.parametrize("scheduling", ["Preferred", "Required"])
def test_running_twice_adds_nothing(scheduling: str) -> None:
    annotations = {
        **mounts(("local-ready", "/a"), ("pvc-downloading", "/b")),
        names.ANNOTATION_SCHEDULING: scheduling,
    }
    obj = pod(annotations)
    patched = apply_and_validate(obj, run(obj))
    again = run(patched)
    assert again["response"]["allowed"] is True
    assert patch_of(again) == []


def test_pod_without_containers_is_refused_not_crashed() -> None:
    obj: dict[str, Any] = pod(mounts(("local-ready", "/a")))
    obj["spec"] = {"containers": []}
    code, message = denial(run(obj))
    assert code == 400 and message.startswith("spec.containers")


def test_patch_escapes_json_pointer_characters() -> None:
    assert review.json_pointer("metadata", "labels", "a/b~c") == "/metadata/labels/a~1b~0c"
    obj = pod(mounts(("local-ready", "/a")))
    obj["metadata"]["labels"] = {"x": "y"}
    paths = [op["path"] for op in patch_of(run(obj))]
    assert "/metadata/labels/consumer.praesto.io~1local-ready" in paths
    assert json.dumps(paths).count("~1") >= 2
