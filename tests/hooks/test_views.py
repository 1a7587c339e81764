"""The typed request views (hooks/views.py): one read of Metacontroller's request, one rollout plan per pass."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from praesto.hooks import hook_protocol, modelcache, rolling
from praesto.hooks.views import DecoratedNode, DecoratorRequest, SyncRequest

from praesto import names
from testkit.hook_objects import NOW, cache_node, mcn, node_status, sync_request
from testkit.hook_objects import modelcache as mc
from testkit.hook_objects import node_summary as summary
from tests.hooks import golden

SPEC = {
    "source": {"huggingface": {"repo": "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "revision": "main"}},
    "storage": {"size": "5Gi"},
}


def test_the_view_sorts_a_request_by_kind_and_skips_junk() -> None:
    parent = mc("tinyllama", SPEC, status={"phase": "Pending"})
    ready = mcn("tinyllama", "node-a", node_status(names.PHASE_READY))
    request = sync_request(parent, nodes=[cache_node("node-a")], children=[ready], finalizing=True)
    request["children"][hook_protocol.JOB] = {"default/junk": "not an object"}
    view = SyncRequest.parse(request)
    assert (view.parent.name, view.parent.namespace, view.parent.before) == (
        "tinyllama",
        "default",
        {"phase": "Pending"},
    )
    (copy,) = view.children.copies
    assert (copy.node, copy.status["phase"], copy.obj) == ("node-a", names.PHASE_READY, ready)
    assert view.children.jobs == () and view.children.every == (ready,)
    assert [n["metadata"]["name"] for n in view.related.nodes] == ["node-a"]
    assert view.finalizing is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.finalizing = False  # type: ignore[misc]


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ([], "request body must be a JSON object"),
        ({"parent": {"metadata": {}}}, "request.parent.metadata.name: Required value"),
        ({"parent": {"metadata": {"name": "x"}}, "related": []}, "request.related: must be an object"),
    ],
)
def test_a_body_that_is_no_hook_request_is_refused_naming_the_part(request_body: Any, message: str) -> None:
    with pytest.raises(hook_protocol.BadRequest, match=message):
        SyncRequest.parse(request_body)


def test_a_local_sync_pass_plans_the_rollout_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[rolling.Rollout] = []
    real = rolling.plan

    def counted(*args: Any) -> rolling.Rollout:
        calls.append(real(*args))
        return calls[-1]

    monkeypatch.setattr(rolling, "plan", counted)
    parent = mc("tinyllama", SPEC)
    nodes = [cache_node(n) for n in ("node-a", "node-b")]
    response = modelcache.sync(sync_request(parent, nodes=nodes), golden.CONFIG, NOW)
    assert len(calls) == 1
    assert response["status"]["totalNodes"] == 2


def test_the_decorator_view_reads_the_node_its_summary_and_its_copies_of_any_version() -> None:
    """`DecoratorHookRequest` (Metacontroller v4.17.2 pkg/controller/decorator/api/v2/hooks.go)."""
    node = cache_node("node-a")
    mine, other = summary("node-a"), summary("node-b")
    ready = mcn("tinyllama", "node-a", node_status(names.PHASE_READY))
    older = mcn("older", "node-a")
    request = {
        "object": node,
        "attachments": {hook_protocol.NODESUMMARY: {"node-b": other, "node-a": mine}},
        "related": {
            hook_protocol.MODELCACHENODE: {"default/a": ready, "default/junk": "not an object"},
            f"{names.MODELCACHENODE_KIND}.praesto.praesto.io/v1alpha0": {"default/b": older},
            hook_protocol.POD: {"default/p": {"metadata": {"name": "p"}}},
        },
    }
    view = DecoratorRequest.parse(request)
    assert (view.node.obj, view.node.name, view.node.labels) == (node, "node-a", node["metadata"]["labels"])
    assert view.summary is mine and view.cache_nodes == (ready, older) and view.finalizing is False
    bare = DecoratorRequest.parse({"object": node, "attachments": None, "related": []})
    assert (bare.summary, bare.cache_nodes) == (None, ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.summary = None  # type: ignore[misc]


@pytest.mark.parametrize(
    ("request_body", "key"),
    [
        ([], "object"),
        ({"parent": {"metadata": {"name": "n"}}}, "object"),  # the customize shape sent to sync
        ({"object": {"metadata": {"name": ""}}}, "object"),
        ({"parent": {"metadata": {"labels": {}}}}, "parent"),
    ],
)
def test_a_decorator_body_without_a_named_node_is_refused_naming_the_key(request_body: Any, key: str) -> None:
    with pytest.raises(hook_protocol.BadRequest, match=f"request.{key} must be a Node with metadata.name"):
        DecoratedNode.parse(request_body, key)
