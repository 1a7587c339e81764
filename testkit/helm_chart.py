"""Render charts/praesto with the real Helm engine (helm-python-sdk) and check objects against schemas.

Helm cannot pull the Metacontroller dependency here (no registry access), and
`Chart.render` simply leaves a missing subchart out. Tests that need the
subchart's output (its ClusterRole, to prove our values restrict it) render a
temporary copy of the chart (`chart_with_metacontroller_standin`) whose `charts/`
holds the test-only stand-in of testkit/metacontroller_subchart.py. It is never
written into the real chart.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART_DIR = ROOT / "charts" / "praesto"
CRD_DIR = CHART_DIR / "crds"
RELEASE = "praesto"
NAMESPACE = "praesto-system"

Obj = dict[str, Any]


def parse_manifests(rendered: dict[str, str]) -> list[Obj]:
    """Every object of a render, in template order; NOTES.txt and empty documents skipped."""
    objects: list[Obj] = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(rendered[path]):
            if doc:
                objects.append(doc)
    return objects


def render(
    values: Obj | None = None,
    *,
    chart_dir: Path = CHART_DIR,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
) -> dict[str, str]:
    """Render offline (`lookup` returns nothing), as `helm template` would."""
    with helm.Chart.load(chart_dir) as chart:
        return chart.render(values or {}, name=name, namespace=namespace, is_install=True)


def render_objects(values: Obj | None = None, **kwargs: Any) -> list[Obj]:
    return parse_manifests(render(values, **kwargs))


def find(objects: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def deep_merge(base: Obj, override: Obj) -> Obj:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def value_key_exists(key: str) -> bool:
    """Whether `a.b.c` is a key values.schema.json accepts (a `\\.` in a segment is a literal dot)."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    node: Any = schema
    for part in re.split(r"(?<!\\)\.", key):
        part = part.replace("\\.", ".")
        props = node.get("properties") or {}
        if part in props:
            node = props[part]
            if "$ref" in node:
                node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
            continue
        # JSON Schema allows unlisted keys unless additionalProperties is false
        return node.get("additionalProperties", True) is not False
    return True


# --- the test-only Metacontroller stand-in --------------------------------------------


def chart_with_metacontroller_standin(tmp: Path) -> Path:
    """A copy of charts/praesto whose charts/ holds the test-only stand-in subchart
    (testkit/metacontroller_subchart.py, which builds on this module's CHART_DIR)."""
    from testkit.metacontroller_subchart import chart_copy_with_dependency

    return chart_copy_with_dependency(tmp)


# --- CRD schemas as strict JSON Schemas ------------------------------------------------


def crd_documents(directory: Path) -> Iterator[Obj]:
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                yield doc


def crd_schemas(docs: Iterator[Obj] | list[Obj]) -> dict[tuple[str, str], Obj]:
    """`(apiVersion, kind)` -> strict JSON Schema of every served version."""
    out: dict[tuple[str, str], Obj] = {}
    for crd in docs:
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            out[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = strict_schema(schema)
    return out


def strict_schema(node: Any) -> Any:
    """An OpenAPI v3 structural schema as JSON Schema that rejects unknown fields.

    The API server prunes unknown fields and `kubectl --validate=strict` refuses
    them; a plain JSON Schema would silently accept them. So every object with
    declared properties (and no `additionalProperties` or
    `x-kubernetes-preserve-unknown-fields`) gets `additionalProperties: false`;
    `x-kubernetes-int-or-string` becomes a type union; `metadata` stays open.
    """
    if isinstance(node, list):
        return [strict_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    if node.get("type") == "object" and "properties" in node and not preserve:
        out.setdefault("additionalProperties", False)
    if node.get("nullable"):
        out.pop("nullable", None)
        if "type" in out:
            out["type"] = [out["type"], "null"]
    return out
