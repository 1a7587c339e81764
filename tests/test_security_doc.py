"""docs/security.md, the threat model, keeps up with the CRDs and the tests it cites.

Every spec field of both CRDs (walked from `charts/praesto/crds/`) has a row in its CRD's field
table, every `tests/...::name` the doc cites is defined in that file, and every table row names
a test or says `MISSING:`. The rows that say `MISSING:` (a property no test proves yet) fail a
test of their own, listing each one, so CI shows exactly which rows lack a test.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from praesto import names
from testkit.helm_chart import CRD_DIR, ROOT, crd_documents

DOC = ROOT / "docs" / "security.md"
README = ROOT / "README.md"
MISSING = "MISSING:"
CITE = re.compile(r"(tests/[\w/]+\.py)::(\w+)(?:\[[^\]]*\])?")
BRACES = re.compile(r"\{([^{}]*)\}")
CODE = re.compile(r"`([^`]+)`")
Obj = dict[str, Any]


def spec_leaves(schema: Obj, path: str) -> Iterator[str]:
    """Dotted paths of the leaves under `schema`: a field without named properties is a leaf (a map
    such as nodeSelector, a free-form object, a scalar); array items with properties are walked."""
    properties = schema.get("properties")
    items = schema.get("items") or {}
    if not properties and items.get("properties"):
        properties = items["properties"]
    if not properties:
        yield path
        return
    for name, child in properties.items():
        yield from spec_leaves(child, f"{path}.{name}")


def crd_fields() -> dict[str, set[str]]:
    """kind -> every spec leaf path of every served version (NodeSummary has no spec: labels only,
    written by Metacontroller alone)."""
    out: dict[str, set[str]] = {}
    for crd in crd_documents(CRD_DIR):
        kind = crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if "spec" not in version["schema"]["openAPIV3Schema"]["properties"]:
                continue
            spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
            out.setdefault(kind, set()).update(spec_leaves(spec, "spec"))
    return out


def expand(pattern: str) -> list[str]:
    """`a.{b,c}.{d,e}` -> a.b.d, a.b.e, a.c.d, a.c.e (the doc's shorthand for sibling fields)."""
    parts = BRACES.split(pattern)  # text, choices, text, choices, ..., text
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def sections(text: str) -> dict[str, str]:
    """`## Heading` -> the text up to the next `## ` heading."""
    out: dict[str, str] = {}
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        heading, _, body = block.partition("\n")
        out[heading.strip()] = body
    return out


def rows(text: str) -> list[list[str]]:
    """The cells of every table row (header and separator rows left out)."""
    out = []
    for line in text.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if cells[0] in ("Field", "Input"):
            continue
        out.append(cells)
    return out


def documented_fields(table: str) -> set[str]:
    """Spec paths named in the first cell of a field table's rows."""
    out: set[str] = set()
    for cells in rows(table):
        for code in CODE.findall(cells[0]):
            if code.startswith("spec."):
                out.update(expand(code))
    return out


def field_table(kind: str) -> str:
    found = sections(DOC.read_text())
    heading = f"{kind} fields"
    assert heading in found, f"docs/security.md has no '## {heading}' section"
    return found[heading]


def defines(path: Path, name: str) -> bool:
    return bool(re.search(rf"^\s*(?:async\s+)?def {re.escape(name)}\(", path.read_text(), re.M))


def test_every_spec_field_of_both_crds_has_a_row() -> None:
    fields = crd_fields()
    assert set(fields) == {names.MODELCACHE_KIND, names.MODELCACHENODE_KIND}
    problems = []
    for kind, paths in sorted(fields.items()):
        documented = documented_fields(field_table(kind))
        problems += [f"{kind} {path}: no row" for path in sorted(paths - documented)]
        problems += [f"{kind} {path}: a row, but no such field" for path in sorted(documented - paths)]
    assert not problems, "docs/security.md field tables:\n" + "\n".join(problems)


def test_every_cited_test_exists() -> None:
    cited = CITE.findall(DOC.read_text())
    assert len(cited) > 50
    unknown = sorted(
        {
            f"{path}::{name}"
            for path, name in cited
            if not (ROOT / path).is_file() or not defines(ROOT / path, name)
        }
    )
    assert not unknown, "docs/security.md cites tests that do not exist:\n" + "\n".join(unknown)


def test_every_row_names_a_test_or_says_what_is_missing() -> None:
    bare = [
        cells[0] for cells in rows(DOC.read_text()) if not CITE.search(cells[-1]) and MISSING not in cells[-1]
    ]
    assert not bare, "rows without a test or a MISSING note:\n" + "\n".join(bare)


def test_the_readme_and_the_threat_model_link_each_other() -> None:
    assert "(docs/security.md)" in README.read_text()
    assert "(../README.md#security-model)" in DOC.read_text()
    assert "\n## Security model\n" in README.read_text()


def test_no_row_is_missing_its_test() -> None:
    """Fails while a row says MISSING: each listed row is a property no test proves yet."""
    missing = [
        f"{cells[0]}: {cells[-1][cells[-1].index(MISSING) :]}"
        for cells in rows(DOC.read_text())
        if MISSING in cells[-1]
    ]
    if missing:
        pytest.fail(
            f"{len(missing)} rows of docs/security.md lack a test:\n" + "\n".join(missing), pytrace=False
        )


def test_the_walk_and_the_shorthand_reach_nested_fields() -> None:
    schema = {
        "properties": {
            "a": {"properties": {"b": {"type": "string"}, "m": {"type": "object"}}},
            "l": {"type": "array", "items": {"properties": {"x": {"type": "string"}}}},
        }
    }
    assert sorted(spec_leaves(schema, "spec")) == ["spec.a.b", "spec.a.m", "spec.l.x"]
    assert expand("spec.{p,q}.r.{s,t}") == ["spec.p.r.s", "spec.p.r.t", "spec.q.r.s", "spec.q.r.t"]
    assert expand("spec.a") == ["spec.a"]
