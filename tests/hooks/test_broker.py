"""The credentials broker's decision (hooks/broker.py): each refusal, and the one grant, through the
flow `answer` over a stand-in API (the real API server's answers: tests/cluster/test_broker.py)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from praesto.hooks import broker
from praesto.hooks.broker_http import CONFIG_BROKER_API
from praesto.hooks.serving.app import create_app

from praesto import names

AGENT = "system:serviceaccount:praesto-system:praesto-node-agent"
ASK = {"namespace": "team-a", "cache": "m", "kind": "Secret", "name": "hf"}
TOKEN_VALUE = base64.b64encode(b"hf_tenant_token").decode()


def review(
    node: str = "node-a", user: str = AGENT, audiences: tuple[str, ...] = (names.BROKER_TOKEN_AUDIENCE,)
) -> dict[str, Any]:
    extra = {names.TOKEN_EXTRA_NODE_NAME: [node]} if node else {}
    return {"authenticated": True, "audiences": list(audiences), "user": {"username": user, "extra": extra}}


def copy(node: str = "node-a", phase: str = names.PHASE_DOWNLOADING, **status: Any) -> dict[str, Any]:
    return {
        "spec": {
            "modelCacheName": "m",
            "nodeName": node,
            "source": {"uri": "hf://org/m", "secretRef": {"name": "hf"}},
        },
        "status": {"phase": phase, **status},
    }


@dataclass
class FakeApi:
    reviewed: Mapping[str, Any] = field(default_factory=review)
    copies: dict[str, Any] = field(default_factory=lambda: {names.modelcachenode_name("m", "node-a"): copy()})
    objects: dict[tuple[str, str], Any] = field(
        default_factory=lambda: {("Secret", "hf"): {"data": {"HF_TOKEN": TOKEN_VALUE}, "metadata": {}}}
    )
    down: bool = False
    calls: list[str] = field(default_factory=list)

    def review(self, token: str) -> Mapping[str, Any]:
        self.calls.append("review")
        if self.down:
            raise broker.Unavailable("cannot check the token now (MaxRetryError)")
        return self.reviewed

    def copy(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.calls.append("copy")
        return self.copies.get(name) if namespace == "team-a" else None

    def read(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.calls.append("read")
        return self.objects.get((kind, name))


def ask(api: FakeApi, body: Any = ASK, token: str | None = "t") -> broker.Decision:
    return broker.answer(api, token, body, AGENT)[0]


def test_the_agent_of_the_node_whose_copy_downloads_gets_the_secret() -> None:
    decision = ask(FakeApi())
    assert decision.status == 200 and decision.body["data"] == {"HF_TOKEN": TOKEN_VALUE}


@pytest.mark.parametrize(
    ("api", "body", "token", "status", "reason"),
    [
        (FakeApi(), ASK, None, 401, "Unauthenticated"),
        (FakeApi(), {**ASK, "kind": "Pod"}, "t", 400, "BadRequest"),
        (FakeApi(), {**ASK, "namespace": "Team_A"}, "t", 400, "BadRequest"),
        (FakeApi(), [ASK], "t", 400, "BadRequest"),
        (FakeApi(reviewed={"authenticated": False}), ASK, "t", 401, "Unauthenticated"),
        (FakeApi(reviewed=review(audiences=("praesto-peer/node-a",))), ASK, "t", 401, "Unauthenticated"),
        (
            FakeApi(reviewed=review(user="system:serviceaccount:team-a:default")),
            ASK,
            "t",
            403,
            "NotTheNodeAgent",
        ),
        (FakeApi(reviewed=review(node="")), ASK, "t", 401, "NotBoundToANode"),
        (FakeApi(reviewed=review(node="node-b")), ASK, "t", 403, "NoCopyOnThisNode"),
        (FakeApi(), {**ASK, "cache": "other"}, "t", 403, "NoCopyOnThisNode"),
        (FakeApi(), {**ASK, "name": "unrelated"}, "t", 403, "NotNamedByTheCopy"),
        (FakeApi(), {**ASK, "kind": "ConfigMap"}, "t", 403, "NotNamedByTheCopy"),
        (FakeApi(objects={}), ASK, "t", 404, "NotFound"),
        (FakeApi(down=True), ASK, "t", 503, "Unavailable"),
    ],
)
def test_each_refusal_is_one_line_with_its_own_reason(
    api: FakeApi, body: Any, token: str | None, status: int, reason: str
) -> None:
    decision = ask(api, body, token)
    assert (decision.status, decision.reason) == (status, reason)
    assert decision.message and "\n" not in decision.message and not decision.body
    assert TOKEN_VALUE not in decision.message


def test_a_copy_on_disk_for_its_source_is_refused_and_one_fetching_beside_it_is_not() -> None:
    name = names.modelcachenode_name("m", "node-a")
    for status, expected in [
        ({"phase": names.PHASE_READY}, 409),
        ({"phase": names.PHASE_EVICTED}, 409),
        ({"phase": names.PHASE_READY, "next": {"phase": names.NEXT_READY}}, 409),
        ({"phase": names.PHASE_READY, "next": {"phase": names.NEXT_DOWNLOADING}}, 200),
        ({"phase": names.PHASE_FAILED}, 200),
        ({"phase": names.PHASE_PENDING}, 200),
        ({}, 200),
    ]:
        api = FakeApi(copies={name: {**copy(), "status": status}})
        decision = ask(api)
        assert decision.status == expected, status
        if expected == 409:
            assert decision.reason == "CopySettled" and "read" not in api.calls  # never read when refused


def test_the_token_is_checked_before_anything_else_is_read() -> None:
    api = FakeApi(reviewed={"authenticated": False})
    ask(api)
    assert api.calls == ["review"]


def test_a_secret_over_the_bound_is_not_handed_out() -> None:
    big = base64.b64encode(b"x" * (names.BROKER_MAX_OBJECT_BYTES + 1)).decode()
    decision = ask(FakeApi(objects={("Secret", "hf"): {"data": {"k": big}}}))
    assert (decision.status, decision.reason) == (413, "TooLarge")


def test_the_verification_objects_a_copy_names_are_served_too() -> None:
    spec = copy()["spec"]
    spec["verification"] = {"method": "publicKey", "configMapRef": {"name": "keys", "key": "k.pub"}}
    api = FakeApi(
        copies={names.modelcachenode_name("m", "node-a"): {"spec": spec, "status": {}}},
        objects={("ConfigMap", "keys"): {"data": {"k.pub": "PEM"}}},
    )
    decision = ask(api, {**ASK, "kind": "ConfigMap", "name": "keys"})
    assert decision.status == 200 and decision.body == {"kind": "ConfigMap", "data": {"k.pub": "PEM"}}


def test_the_route_answers_json_and_logs_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app()
    app.config[CONFIG_BROKER_API] = FakeApi()
    web = app.test_client()
    granted = web.post(names.BROKER_PATH, json=ASK, headers={"Authorization": "Bearer t"})
    assert granted.status_code == 200 and granted.get_json()["data"]["HF_TOKEN"] == TOKEN_VALUE
    refused = web.post(
        names.BROKER_PATH, json={**ASK, "name": "unrelated"}, headers={"Authorization": "Bearer t"}
    )
    assert refused.status_code == 403 and refused.get_json()["reason"] == "NotNamedByTheCopy"
    assert web.post(names.BROKER_PATH, json=ASK).status_code == 401
    assert TOKEN_VALUE not in caplog.text and "hf_tenant_token" not in caplog.text
