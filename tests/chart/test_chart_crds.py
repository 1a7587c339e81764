"""Our CRDs: structurally valid CRDs, and the seed's and README's ModelCache examples validate against them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from praesto import names
from testkit.helm_chart import CRD_DIR, ROOT, crd_documents, crd_schemas

DATA = Path(__file__).parent / "data"

pytestmark = pytest.mark.skipif(
    not any(CRD_DIR.glob("*.yaml")), reason="CRDs not written yet (charts/praesto/crds/ is empty)"
)


def our_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    return crd_schemas(list(crd_documents(CRD_DIR)))


def readme_examples() -> list[dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    docs = [yaml.safe_load(b) for b in blocks]
    return [d for d in docs if isinstance(d, dict) and d.get("apiVersion") == names.API_VERSION]


def seed_examples() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DATA / "seed-examples.yaml").read_text()) if d]


def test_crds_are_valid_kubernetes_objects() -> None:
    docs = list(crd_documents(CRD_DIR))
    assert {d["spec"]["names"]["kind"] for d in docs} == {
        names.MODELCACHE_KIND,
        names.MODELCACHENODE_KIND,
        names.NODESUMMARY_KIND,
    }
    for doc in docs:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
        assert doc["spec"]["group"] == names.GROUP


@pytest.mark.parametrize("source", ["seed", "readme"])
def test_examples_validate_against_the_crds(source: str) -> None:
    examples = seed_examples() if source == "seed" else readme_examples()
    assert len(examples) >= 2
    schemas = our_schemas()
    for example in examples:
        jsonschema.validate(example, schemas[(example["apiVersion"], example["kind"])])


def test_crd_schema_rejects_what_it_should() -> None:
    """The same validator refuses a misspelt field and a missing size, so passing means something."""
    schema = our_schemas()[(names.API_VERSION, names.MODELCACHE_KIND)]
    example = seed_examples()[0]
    typo = {**example, "spec": {**example["spec"], "nodeSelecter": {}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(typo, schema)
    no_size = {**example, "spec": {**example["spec"], "storage": {}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(no_size, schema)


def test_chart_ships_the_crds() -> None:
    with helm.Chart.load(CRD_DIR.parent) as chart:
        shipped = {c["filename"] for c in chart.crds}
    assert {f"praesto/crds/{p.name}" for p in CRD_DIR.glob("*.yaml")} <= shipped
