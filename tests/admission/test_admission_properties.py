"""Property tests: arbitrary annotations and Pod shapes never give a 500 or an invalid patch.

Requests go through the Flask blueprint (the same HTTP layer gunicorn serves)
with in-memory lookups, so hypothesis can try thousands of shapes quickly.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import kubernetes_validate
from flask import Flask
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from praesto.hooks.admission.http import CONFIG_IMAGE, CONFIG_LOOKUPS, blueprint

from praesto import names
from testkit.admission_objects import CACHES, IMAGE, K8S_VERSION, Obj, patch_of, review_body, static_lookups

CACHE_NAMES = [c["metadata"]["name"] for c in CACHES]
DNS = st.from_regex(r"\A[a-z]([a-z0-9-]{0,10}[a-z0-9])?\Z")
PATH_PART = st.sampled_from(["models", "m", "..", ".", "", "data", "a b", "x~y", "é"])
PATHS = st.one_of(
    st.lists(PATH_PART, max_size=4).map(lambda parts: "/" + "/".join(parts)),
    st.lists(PATH_PART, max_size=3).map("/".join),
    st.text(max_size=20),
)
MOUNT = st.fixed_dictionaries(
    {"modelCache": st.one_of(st.sampled_from(CACHE_NAMES), DNS, st.text(max_size=8)), "mountPath": PATHS},
    optional={"extra": st.integers()},
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
MOUNTS_VALUE = st.one_of(
    st.lists(MOUNT, max_size=4).map(json.dumps),
    JSONISH.map(json.dumps),
    st.text(max_size=30),
)
ARBITRARY_ANNOTATIONS = st.fixed_dictionaries(
    {},
    optional={
        names.ANNOTATION_MODEL_MOUNTS: MOUNTS_VALUE,
        names.ANNOTATION_LEGACY_MODEL_CACHE: st.one_of(st.sampled_from(CACHE_NAMES), st.text(max_size=10)),
        names.ANNOTATION_LEGACY_MOUNT_PATH: PATHS,
        names.ANNOTATION_TARGET_CONTAINER: st.sampled_from(["app", "side", "", "nope"]),
        names.ANNOTATION_SCHEDULING: st.sampled_from(["Preferred", "Required", "None", "required", ""]),
        "unrelated.example/x": st.text(max_size=5),
    },
)
# Mostly well-formed requests, so most examples reach the patch builder.
USABLE = [n for n in CACHE_NAMES if not n.endswith("-failed")]
GOOD_PATH = st.sampled_from(["/models", "/data/m", "/srv/model/", "//opt//llm", "/x/./y"])
GOOD_MOUNTS = st.lists(
    st.fixed_dictionaries({"modelCache": st.sampled_from(USABLE), "mountPath": GOOD_PATH}),
    min_size=1,
    max_size=3,
    unique_by=(lambda m: m["modelCache"], lambda m: m["mountPath"]),
).map(json.dumps)
GOOD_OPTIONS = {
    names.ANNOTATION_TARGET_CONTAINER: st.sampled_from(["app", "side"]),
    names.ANNOTATION_SCHEDULING: st.sampled_from(["Preferred", "Required", "None"]),
}
GOOD_ANNOTATIONS = st.one_of(
    st.fixed_dictionaries({names.ANNOTATION_MODEL_MOUNTS: GOOD_MOUNTS}, optional=GOOD_OPTIONS),
    st.fixed_dictionaries(
        {names.ANNOTATION_LEGACY_MODEL_CACHE: st.sampled_from(USABLE)}, optional=GOOD_OPTIONS
    ),
)
ANNOTATIONS = st.one_of(GOOD_ANNOTATIONS, GOOD_ANNOTATIONS, GOOD_ANNOTATIONS, ARBITRARY_ANNOTATIONS)
VOLUME_MOUNT = st.builds(
    lambda name, path: {"name": name, "mountPath": path},
    st.sampled_from(["v1", "praesto-local-ready", "praesto-pvc-ready"]),
    st.sampled_from(["/models", "/data", "/tmp", "/models/a", "/m"]),
)
CONTAINER = st.builds(
    lambda name, mounts: {
        "name": name,
        "image": "busybox",
        **({"volumeMounts": mounts} if mounts is not None else {}),
    },
    st.sampled_from(["app", "side", "praesto-wait-pvc-ready"]),
    st.none() | st.lists(VOLUME_MOUNT, max_size=2, unique_by=lambda m: m["mountPath"]),
)
TERM = st.fixed_dictionaries(
    {"matchExpressions": st.just([{"key": "zone", "operator": "In", "values": ["a"]}])}
)
AFFINITY: st.SearchStrategy[Obj] = st.one_of(
    st.just({}),
    st.just({"podAntiAffinity": {}}),
    st.lists(TERM, min_size=1, max_size=2).map(
        lambda t: {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": t}}
        }
    ),
    st.just({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}),
)


def _empty_dir(name: str) -> Obj:
    return {"name": name, "emptyDir": {}}


@st.composite
def pods(draw: st.DrawFn) -> Obj:
    containers = draw(st.lists(CONTAINER, min_size=1, max_size=3, unique_by=lambda c: c["name"]))
    spec: Obj = {"containers": containers}
    if draw(st.booleans()):
        spec["volumes"] = draw(
            st.lists(
                st.sampled_from(["v1", "praesto-local-ready", "praesto-pvc-ready"]).map(_empty_dir),
                unique_by=lambda v: str(v["name"]),
                max_size=3,
            )
        )
    if draw(st.booleans()):
        spec["initContainers"] = [{"name": "init", "image": "busybox"}]
    if draw(st.booleans()):
        spec["affinity"] = draw(AFFINITY)
    meta: Obj = {"generateName": "p-", "annotations": draw(ANNOTATIONS)}
    if draw(st.booleans()):
        meta["labels"] = {"app": "x", names.LABEL_USES_MODEL_CACHE: draw(st.sampled_from(["true", "false"]))}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def app() -> Flask:
    flask_app = Flask(__name__)
    flask_app.config[CONFIG_LOOKUPS] = static_lookups()
    flask_app.config[CONFIG_IMAGE] = IMAGE
    flask_app.register_blueprint(blueprint)
    return flask_app


CLIENT = app().test_client()


def schema_valid(obj: Obj) -> bool:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError:
        return False
    return True


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods())
def test_any_pod_gets_a_valid_answer_and_a_valid_patch(obj: Obj) -> None:
    response = CLIENT.post("/admission/mutate-pod", json=review_body(obj))
    assert response.status_code == 200
    answer: Any = response.get_json()
    body = answer["response"]
    assert body["uid"] == "uid-1" and isinstance(body["allowed"], bool)
    if not body["allowed"]:
        event(f"refused {body['status']['code']}")
        assert body["status"]["code"] in (400, 403, 503)
        assert body["status"]["message"].count("; ") >= 1  # field: cause; fix
        return
    ops = patch_of(answer)
    event("patched" if ops else "untouched")
    assert all(op["op"] == "add" for op in ops)
    patched = jsonpatch.apply_patch(copy.deepcopy(obj), ops)
    if schema_valid(obj):
        kubernetes_validate.validate(patched, K8S_VERSION, strict=True)
    existing_init = obj["spec"].get("initContainers", [])
    assert patched["spec"].get("initContainers", [])[: len(existing_init)] == existing_init
    assert patched["spec"].get("ephemeralContainers") == obj["spec"].get("ephemeralContainers")


@settings(max_examples=200, deadline=None)
@given(JSONISH)
def test_any_json_body_gets_200_or_400_never_500(body: Any) -> None:
    for path in ("/admission/mutate-pod", "/admission/validate-modelcache"):
        response = CLIENT.post(path, json=body)
        assert response.status_code in (200, 400)


@settings(max_examples=200, deadline=None)
@given(JSONISH, st.sampled_from(["CREATE", "UPDATE", "DELETE"]))
def test_any_modelcache_spec_gets_a_readable_answer(spec: Any, operation: str) -> None:
    obj = {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHE_KIND,
        "metadata": {"name": "m"},
        "spec": spec,
    }
    response = CLIENT.post(
        "/admission/validate-modelcache", json=review_body(obj, operation, old=copy.deepcopy(obj))
    )
    assert response.status_code == 200
    body: Any = response.get_json()["response"]
    if not body["allowed"]:
        assert body["status"]["code"] in (400, 403, 503)
