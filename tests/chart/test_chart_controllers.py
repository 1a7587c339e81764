"""metacontroller/ holds exactly the controllers the chart installs (rendered as release praesto in praesto-system)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from testkit.helm_chart import ROOT, crd_documents, crd_schemas, find, render_objects

DATA = Path(__file__).parent / "data"
MANIFESTS = ROOT / "metacontroller"
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/version"}


CA_PLACEHOLDER = "<PEM of the CA that signed praesto-hooks' serving certificate>\n"


def as_committed(obj: dict[str, Any]) -> dict[str, Any]:
    """The chart adds its standard labels and its own CA; everything else must be identical."""
    out = copy.deepcopy(obj)
    out["metadata"].pop("labels", None)
    for hook in out["spec"]["hooks"].values():
        hook["webhook"]["caBundle"]["inline"] = CA_PLACEHOLDER
    return out


def committed(kind: str) -> list[dict[str, Any]]:
    docs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == kind]
    return docs


@pytest.mark.parametrize("kind", ["CompositeController", "DecoratorController"])
def test_metacontroller_dir_equals_the_chart(kind: str) -> None:
    files = committed(kind)
    if not files:
        pytest.skip(f"no {kind} in metacontroller/ yet")
    rendered = find(render_objects(), kind)
    assert [as_committed(o) for o in rendered] == files
    assert set(rendered[0]["metadata"]["labels"]) >= HELM_LABELS


def test_controllers_follow_the_release_name_and_namespace() -> None:
    objects = render_objects(name="cache", namespace="ml-infra")
    urls = [
        hook["webhook"]["url"]
        for kind in ("CompositeController", "DecoratorController")
        for obj in find(objects, kind)
        for hook in obj["spec"]["hooks"].values()
    ]
    assert urls and all(u.startswith("https://cache-praesto-hooks.ml-infra.svc/hooks/") for u in urls)


def test_controllers_validate_against_metacontroller_crds() -> None:
    schemas = crd_schemas(list(crd_documents(DATA)))
    for kind in ("CompositeController", "DecoratorController"):
        objects = find(render_objects(), kind) + committed(kind)
        assert objects
        for obj in objects:
            jsonschema.validate(obj, schemas[(obj["apiVersion"], obj["kind"])])
            for hook in obj["spec"]["hooks"].values():
                assert hook["version"] == "v2"  # hook responses are strict in v2


def test_hook_paths_are_served_by_praesto_hooks() -> None:
    """Every URL a controller calls is a route of the real hooks Flask app."""
    app_module = pytest.importorskip("praesto.hooks.serving.app")
    config = pytest.importorskip("praesto.hooks.config")
    app = app_module.create_app(config.HooksConfig())
    routes = {rule.rule for rule in app.url_map.iter_rules()}
    for kind in ("CompositeController", "DecoratorController"):
        for obj in find(render_objects(), kind):
            for hook in obj["spec"]["hooks"].values():
                path = "/" + hook["webhook"]["url"].split("/", 3)[3]
                assert path in routes, f"{path} is not served by praesto-hooks"


def test_chart_pins_a_metacontroller_that_speaks_v2_hooks_and_ca_bundles() -> None:
    """4.12.13 ignored `version: v2` (v2 requests from 4.15.0) and had no caBundle (4.16.0)."""
    chart = yaml.safe_load((ROOT / "charts" / "praesto" / "Chart.yaml").read_text())
    (dependency,) = [d for d in chart["dependencies"] if d["name"] == "metacontroller-helm"]
    assert dependency["version"] == "4.17.2"
    for kind in ("CompositeController", "DecoratorController"):
        for controller in find(render_objects(), kind):
            for hook in controller["spec"]["hooks"].values():
                assert hook["version"] == "v2"
                assert hook["webhook"]["url"].startswith("https://")
                assert hook["webhook"]["caBundle"]["inline"].startswith("-----BEGIN CERTIFICATE-----")
