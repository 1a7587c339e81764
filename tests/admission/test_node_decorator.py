"""Node readiness DecoratorController: golden v2 requests in, expected responses out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask import Flask
from praesto.hooks import nodes

from praesto import names

GOLDEN = sorted((Path(__file__).parent / "golden").glob("node_*.json"))
MANIFEST = Path(__file__).resolve().parents[2] / "metacontroller" / "node-decorator.yaml"


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden(path: Path) -> None:
    golden = load(path)
    assert nodes.customize(golden["customizeRequest"]) == golden["customizeResponse"]
    response = nodes.sync(golden["syncRequest"])
    assert response == golden["syncResponse"]
    assert set(response) <= nodes.SYNC_KEYS  # v2 hooks are strict about unknown keys


def test_goldens_cover_added_changed_removed() -> None:
    values = [v for p in GOLDEN for v in load(p)["syncResponse"]["labels"].values()]
    assert "true" in values and None in values
    assert {p.stem for p in GOLDEN} >= {"node_labels_added", "node_labels_changed", "node_labels_removed"}


def test_http_blueprint_serves_hooks_and_rejects_garbage() -> None:
    app = Flask(__name__)
    app.register_blueprint(nodes.blueprint)
    client = app.test_client()
    golden = load(GOLDEN[0])
    sync = client.post("/hooks/node/sync", json=golden["syncRequest"])
    assert sync.status_code == 200 and sync.get_json() == golden["syncResponse"]
    customize = client.post("/hooks/node/customize", json=golden["customizeRequest"])
    assert customize.get_json() == golden["customizeResponse"]
    assert (
        client.post("/hooks/node/sync", data=b"{not json", content_type="application/json").status_code == 400
    )
    bad = client.post("/hooks/node/sync", json={"object": {"metadata": {}}})
    assert bad.status_code == 400 and "request.object" in bad.get_json()["error"]
    # The v1-style key is not what Metacontroller 4.17.2 sends for a decorator sync.
    old_shape = client.post("/hooks/node/sync", json={"parent": golden["syncRequest"]["object"]})
    assert old_shape.status_code == 400


def test_manifest_points_at_these_hooks() -> None:
    manifest = yaml.safe_load(MANIFEST.read_text())
    assert manifest["kind"] == "DecoratorController"
    assert manifest["spec"]["resources"] == [
        {"apiVersion": "v1", "resource": "nodes", "ignoreStatusChanges": True}
    ]
    # The Node's summary, rewritten in place when its labels change (hooks/node_summary.py).
    assert manifest["spec"]["attachments"] == [
        {
            "apiVersion": names.API_VERSION,
            "resource": names.NODESUMMARY_PLURAL,
            "updateStrategy": {"method": "InPlace"},
        }
    ]
    for hook in ("customize", "sync"):
        spec = manifest["spec"]["hooks"][hook]
        assert spec["version"] == "v2"
        assert spec["webhook"]["url"].endswith(f"/hooks/node/{hook}")
