"""The golden requests through a real `praesto-hooks` gunicorn process over HTTP and HTTPS."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from praesto.hooks import hook_protocol
from praesto.hooks.modelcache import HOOKS

from testkit.server import RunningServer, get_text, hooks_server, post_json
from tests.hooks import golden
from tests.hooks.scenarios import SCENARIOS

ENV = {
    "PRAESTO_DOWNLOADER_IMAGE": golden.CONFIG.downloader_image,
    "PRAESTO_AGENT_SERVICE_ACCOUNT": golden.CONFIG.agent_service_account,
    "PRAESTO_NAMESPACE": golden.CONFIG.namespace,
    "PRAESTO_HF_ENDPOINT": golden.CONFIG.hf_endpoint,
    "PRAESTO_DOWNLOADER_ALLOWED_IMAGES": json.dumps(list(golden.CONFIG.allowed_downloader_images)),
}


@pytest.fixture(scope="module", params=[False, True], ids=["http", "https"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with hooks_server(tmp_path_factory.mktemp("hooks"), tls=request.param, env=ENV, workers=2) as running:
        yield running


def _without_times(value: object) -> object:
    """The server uses the real clock: drop the fields derived from `now`."""
    text = json.dumps(value, sort_keys=True)
    data = json.loads(text)
    for cond in (data.get("status") or {}).get("conditions") or [] if isinstance(data, dict) else []:
        cond.pop("lastTransitionTime", None)
    if isinstance(data, dict):
        (data.get("status") or {}).pop("lastUsedTime", None)
        data.pop("resyncAfterSeconds", None)
    return data


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_requests_over_the_wire(server: RunningServer, name: str) -> None:
    doc = golden.load(name)
    status, body = post_json(server, f"/hooks/modelcache/{doc['hook']}", doc["request"])
    assert status == 200, body
    assert hook_protocol.check_response(doc["hook"], body) == []
    # Same answer as the pure hook at the server's own clock (time-derived fields aside).
    expected = HOOKS[doc["hook"]](doc["request"], golden.CONFIG, datetime.now(UTC))
    assert _without_times(body) == _without_times(expected)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"", "empty"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"parent": 3}', "parent"),
    ],
)
def test_malformed_bodies_get_400_with_a_message(server: RunningServer, raw: bytes, needle: str) -> None:
    status, body = post_json(server, "/hooks/modelcache/sync", None, raw=raw)
    assert status == 400
    assert needle in body["error"]


def test_healthz_and_metrics_count_every_route(server: RunningServer) -> None:
    assert get_text(server, "/healthz") == (200, "ok\n")
    for _ in range(3):
        post_json(server, "/hooks/modelcache/customize", golden.load("customize-local-seed")["request"])
    code, _text = get_text(server, "/nope")
    assert code == 404
    # Two workers each keep their own registry: poll both until one reports the hook.
    seen = ""
    for _ in range(20):
        code, seen = get_text(server, "/metrics")
        if 'path="/hooks/modelcache/customize"' in seen:
            break
    assert code == 200
    assert 'praesto_hooks_requests_total{code="200",method="POST",path="/hooks/modelcache/customize"}' in seen
    assert "praesto_hooks_request_duration_seconds_bucket" in seen
