"""Every field of our CRDs has a description, so `kubectl explain modelcache.spec...` answers.

The walk goes through every served version's schema: each named property, and the properties
nested in `items`, `additionalProperties` and the `anyOf`/`allOf`/`oneOf`/`not` branches. The one
field that cannot carry a description is the root `metadata`: the API server refuses anything
there but `name`/`generateName` restrictions (k8s.io/apiextensions-apiserver v0.37.2,
pkg/apiserver/schema/validation.go, validateStructuralMetadataInvariants) and serves ObjectMeta's
own documentation for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from testkit.helm_chart import CRD_DIR, crd_documents

ROOT_METADATA = "metadata"  # at the schema's root only, see above
BRANCHES = ("anyOf", "allOf", "oneOf")


def fields(schema: dict[str, Any], path: str, *, root: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, schema) of every named property under `schema`, depth first, in file order."""
    for name, child in (schema.get("properties") or {}).items():
        if root and name == ROOT_METADATA:
            continue
        here = f"{path}.{name}" if path else name
        yield here, child
        yield from fields(child, here)
    if isinstance(schema.get("items"), dict):
        yield from fields(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from fields(schema["additionalProperties"], f"{path}{{}}")
    for key in BRANCHES:
        for i, branch in enumerate(schema.get(key) or ()):
            yield from fields(branch, f"{path}.{key}[{i}]")
    if isinstance(schema.get("not"), dict):
        yield from fields(schema["not"], f"{path}.not")


def versions() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{crd['spec']['names']['kind']} {version['name']}", version["schema"]["openAPIV3Schema"])
        for crd in crd_documents(CRD_DIR)
        for version in crd["spec"]["versions"]
    ]


def undescribed(schema: dict[str, Any]) -> list[str]:
    """Paths of the fields without a description; "(root)" is the kind itself."""
    walked = [("(root)", schema), *fields(schema, "", root=True)]
    return [path for path, node in walked if not str(node.get("description") or "").strip()]


@pytest.mark.parametrize(("kind", "schema"), versions(), ids=[k for k, _ in versions()])
def test_every_field_has_a_description(kind: str, schema: dict[str, Any]) -> None:
    missing = undescribed(schema)
    assert not missing, (
        f"{len(missing)} fields of {kind} have no description (kubectl explain shows nothing): "
        + ", ".join(missing)
    )


def test_the_walk_reaches_nested_fields() -> None:
    """Fields inside arrays, maps and branches are found, so a pass means every field was seen;
    only the root's `metadata` is left out, not a nested field of that name."""
    schema = {
        "type": "object",
        "description": "root",
        "properties": {
            "metadata": {"type": "object"},
            "list": {"type": "array", "description": "d", "items": {"properties": {"inItem": {}}}},
            "map": {"description": "d", "additionalProperties": {"properties": {"inMap": {}}}},
            "either": {"description": "d", "anyOf": [{"properties": {"inBranch": {}}}]},
            "inner": {"description": " ", "properties": {"metadata": {"description": "d"}}},
        },
    }
    assert undescribed(schema) == [
        "list[].inItem",
        "map{}.inMap",
        "either.anyOf[0].inBranch",
        "inner",
    ]
