"""`kubectl explain modelcache.spec...` answers: the real API server serves every CRD description.

kubectl v0.37.2 `explain` reads the group's OpenAPI v3 document
(`/openapi/v3/apis/<group>/<version>`, staging/src/k8s.io/kubectl/pkg/explain/v2), which the API
server builds from the installed CRD's schema. The `kube_plane` fixture installs the chart's
`crds/` (testkit/kube_real.py), so this reads what an operator's `kubectl explain` would. The server
serves its own TypeMeta text for `apiVersion` and `kind` and ObjectMeta's for `metadata`
(k8s.io/apiextensions-apiserver v0.37.2, pkg/controller/openapi/builder/builder.go,
addTypeMetaProperties), so those are not compared with ours.
"""

from __future__ import annotations

from typing import Any

import pytest

from praesto import names
from testkit.helm_chart import CRD_DIR, crd_documents
from testkit.kube_real import RealKube
from tests.chart.test_chart_crd_descriptions import fields, undescribed

SERVER_OWNED = frozenset({"apiVersion", "kind"})


def served_schema(kube: RealKube, kind: str) -> dict[str, Any]:
    document = kube.call("GET", f"/openapi/v3/apis/{names.GROUP}/{names.VERSION}")
    schemas = document["components"]["schemas"]
    found = [schema for key, schema in schemas.items() if key.endswith(f".{names.VERSION}.{kind}")]
    assert len(found) == 1, f"the API server serves no single {kind} schema: {sorted(schemas)}"
    schema: dict[str, Any] = found[0]
    return schema


def file_schema(kind: str) -> dict[str, Any]:
    crd = next(d for d in crd_documents(CRD_DIR) if d["spec"]["names"]["kind"] == kind)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == names.VERSION)
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("kind", [names.MODELCACHE_KIND, names.MODELCACHENODE_KIND])
def test_the_api_server_serves_every_description(kube: RealKube, kind: str) -> None:
    served = served_schema(kube, kind)
    assert undescribed(served) == [], f"kubectl explain {kind.lower()} shows fields without a description"
    by_path = {path: node.get("description") for path, node in fields(served, "", root=True)}
    differ = [
        path
        for path, node in fields(file_schema(kind), "", root=True)
        if path not in SERVER_OWNED and by_path.get(path) != node["description"]
    ]
    assert not differ, f"{kind}: the API server serves other descriptions than the chart's CRD for {differ}"
