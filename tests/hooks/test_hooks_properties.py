"""Any parent spec gives a 200 with only v2 keys and children the API server would accept."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from praesto.hooks import hook_protocol
from praesto.hooks.serving.app import create_app

from praesto import names
from testkit.hook_objects import NOW, cache_node, consumer, mcn, modelcache, node_status, sync_request
from tests.hooks import golden
from tests.hooks.schemas import validate_child

json_leaf = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12)
junk = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
repos = st.sampled_from(["TinyLlama/TinyLlama-1.1B-Chat-v1.0", "a/b", "org/model.v2", "nope", ""])
sizes = st.sampled_from(["5Gi", "500Mi", "1e9", "0", "-1Gi", "12", 7, "lots"]) | junk
revisions = st.sampled_from(["main", "v1.0", "7ae557604adf67be50417f59c2c2f167def9a775", "a..b", ""])
secret_refs = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["hf-token", "Bad_Name", ""]) | junk,
        "key": st.sampled_from(["HF_TOKEN", "k y"]),
    },
)
huggingface = st.fixed_dictionaries(
    {"repo": repos | junk},
    optional={
        "revision": revisions,
        "token": st.fixed_dictionaries({"secretRef": secret_refs}) | junk,
        "allowPatterns": st.lists(st.sampled_from(["*.json", "*.safetensors", ""]), max_size=2) | junk,
        "ignorePatterns": st.lists(st.sampled_from(["*.bin"]), max_size=1),
    },
)
sources = (
    st.fixed_dictionaries({"huggingface": huggingface})
    | st.fixed_dictionaries(
        {"uri": st.sampled_from(["hf://a/b:v1", "s3://bucket/prefix", "gs://b/p", "ftp://x", "hf://x"])},
        optional={"secretRef": secret_refs},
    )
    | junk
)
specs = (
    st.fixed_dictionaries(
        {
            "source": sources,
            "storage": st.fixed_dictionaries(
                {"size": sizes}, optional={"storageClassName": st.sampled_from(["rwx", ""]) | junk}
            )
            | junk,
        },
        optional={
            "nodeSelector": st.dictionaries(
                st.sampled_from(["praesto.io/cache-node", "zone", "bad key!"]),
                st.sampled_from(["true", "a", "bad value!"]),
                max_size=2,
            )
            | junk,
            "eviction": st.fixed_dictionaries(
                {"unusedTTL": st.sampled_from(["24h", "30m", "7d", "0s", "soon"]) | junk}
            ),
            "downloader": st.fixed_dictionaries(
                {},
                optional={
                    "image": st.sampled_from(["registry.example/praesto:1", ""]) | junk,
                    "resources": st.just({"limits": {"cpu": "1"}}) | junk,
                    "containerSecurityContext": st.just({"runAsUser": 1000}) | junk,
                },
            )
            | junk,
        },
    )
    | junk
)
parent_names = st.sampled_from(["tinyllama", "a", "x" * 63, "x" * 64, "Bad_Name"])
phases = st.sampled_from([*names.PHASES, "Weird", None])


@pytest.fixture(scope="module")
def client() -> FlaskClient:
    return create_app(golden.CONFIG).test_client()


def _post(client: FlaskClient, hook: str, body: Any) -> dict[str, Any]:
    resp = client.post(f"/hooks/modelcache/{hook}", json=body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    data = resp.get_json()
    assert hook_protocol.check_response(hook, data) == []
    return data  # type: ignore[no-any-return]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=specs, name=parent_names, phase=phases, status_junk=junk, with_pod=st.booleans())
def test_any_spec_gives_200_allowed_keys_and_valid_children(
    client: FlaskClient, spec: Any, name: str, phase: str | None, status_junk: Any, with_pod: bool
) -> None:
    parent = modelcache(name, {})
    parent["spec"] = spec
    parent["status"] = status_junk if isinstance(status_junk, dict) else {"lastUsedTime": status_junk}
    # The CRD refuses such a parent name, so no child of one can exist in a cluster.
    observed = (
        [mcn(name, "node-a", node_status(phase) if phase else None)] if names.is_dns_label(name) else []
    )
    pods = [consumer(name, "app", "node-x")] if with_pod else []
    request = sync_request(
        parent, nodes=[cache_node("node-a"), cache_node("node-b")], pods=pods, children=observed
    )

    _post(client, "customize", {"parent": parent})
    response = _post(client, "sync", request)
    for child in response["children"]:
        validate_child(child)
    final = _post(client, "finalize", {**request, "finalizing": True})
    assert final["finalized"] is (not observed)  # done only when no ModelCacheNode is left


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(downloader=st.dictionaries(st.sampled_from(["image", "resources", "containerSecurityContext"]), junk))
def test_pvc_mode_downloader_overrides_never_give_an_invalid_job(
    client: FlaskClient, downloader: Any
) -> None:
    spec = {
        "source": {"huggingface": {"repo": "a/b"}},
        "storage": {"size": "1Gi", "storageClassName": "rwx"},
        "downloader": downloader,
    }
    response = _post(client, "sync", sync_request(modelcache("rwx", spec)))
    for child in response["children"]:
        validate_child(child)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=junk)
def test_non_requests_get_400_not_500(client: FlaskClient, body: Any) -> None:
    for hook in ("customize", "sync", "finalize"):
        resp = client.post(f"/hooks/modelcache/{hook}", json=body)
        assert resp.status_code in (200, 400), resp.get_data(as_text=True)
        if resp.status_code == 400:
            assert resp.get_json()["error"]


def test_valid_specs_always_give_valid_children_for_seed_examples() -> None:
    from tests.hooks.scenarios import SCENARIOS

    for name, (hook, _build) in SCENARIOS.items():
        if hook == "customize":
            continue
        for child in golden.load(name)["response"]["children"]:
            validate_child(child)
    assert NOW.tzinfo is not None
