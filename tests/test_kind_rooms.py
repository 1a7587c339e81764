"""One room per source kind (issue 39 item 1): only the kind table and the origin packages name a kind.

The control plane asks `praesto/kinds.py` what a kind pins, resolves, rolls and which credential
shape it takes; the agent's downloads ask their origin under agent/download/origins/. Anywhere
else, a comparison against a kind's scheme or form name (`scheme == "hf"`, `scheme in ("s3", ...)`,
`match scheme: case "oci"`, `uri.startswith("hf://")`) or a kind predicate (`source.object_store`)
is a rule spread thin: adding ModelScope would mean finding it. Read with `ast` from the source.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from praesto.hooks.admission.validate import immutable_changes
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc_job import download_job

from praesto import kinds, names
from praesto.spec import parse_spec, parse_uri, source_from_node_spec
from testkit.hook_objects import modelcache

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("praesto", "hooks", "agent", "csi")
TABLE = "praesto/kinds.py"
ORIGINS = "agent/download/origins/"
# Every scheme and form name of the table, and the words a kind went by before it.
KIND_WORDS = (
    set(kinds.URI_SCHEMES) | set(kinds.FORMS) | {"objectStore", "object_store", "huggingface", "modelscope"}
)
KIND_PREDICATE = re.compile(r"^(is_)?(object_store|objstore|hf|oci|huggingface|modelscope|ms|s3|gs|az)$")
SCHEME_CONSTANT = re.compile(
    r"^(ocireference\.SCHEME|.*_SCHEMES)$"
)  # a kind by name: OBJECT_STORE_SCHEMES, ...

# Modules that still branch on a kind, each with why; this list only shrinks (it is empty: every
# branch lives in praesto/kinds.py or agent/download/origins/).
ALLOWED: dict[str, str] = {}


def _modules() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _kind_word(node: ast.AST) -> bool:
    """A literal kind name (or `kind://`), or a tuple/list/set holding one, or a SCHEME constant."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in KIND_WORDS or (node.value.split("://")[0] in KIND_WORDS and "://" in node.value)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_kind_word(element) for element in node.elts)
    if isinstance(node, ast.Starred):
        return _kind_word(node.value)
    return isinstance(node, (ast.Attribute, ast.Name)) and bool(SCHEME_CONSTANT.match(ast.unparse(node)))


def kind_branches(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every kind branch in a module."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(map(_kind_word, [node.left, *node.comparators])):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.MatchValue) and _kind_word(node.value):
            found.append((node.lineno, f"case {ast.unparse(node.value)}"))
        elif (isinstance(node, ast.Attribute) and KIND_PREDICATE.match(node.attr)) or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
            and any(map(_kind_word, node.args))
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def _branching() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        if rel == TABLE or rel.startswith(ORIGINS):
            continue
        found = kind_branches(ast.parse(path.read_text(), rel))
        if found:
            out[rel] = found
    return out


def test_no_module_outside_the_table_and_the_origins_branches_on_a_kind() -> None:
    spread = {path: found for path, found in _branching().items() if path not in ALLOWED}
    shown = "\n".join(f"  {path}:{line}: {what}" for path, found in spread.items() for line, what in found)
    assert not spread, f"kind branches outside {TABLE} and {ORIGINS}* (ask the table):\n{shown}"


def test_the_allow_list_only_names_modules_that_still_branch() -> None:
    """An entry whose module no longer branches (or is gone) must leave the list."""
    branching = _branching()
    stale = sorted(path for path in ALLOWED if path not in branching)
    assert not stale, f"drop these from ALLOWED, they no longer branch on a kind: {stale}"


@pytest.mark.parametrize(
    "source",
    [
        "scheme == 'hf'",
        "source.scheme in ('s3', 'gs', 'az')",
        "scheme != ocireference.SCHEME",
        "uri.startswith('oci://')",
        "source.object_store",
        "form == 'modelscope'",
        "match scheme:\n    case 'ms':\n        pass",
    ],
)
def test_the_rule_sees_each_way_of_branching(source: str) -> None:
    assert kind_branches(ast.parse(source))


def test_the_rule_leaves_other_strings_alone() -> None:
    assert not kind_branches(ast.parse("url.scheme != 'https'\nunit == 'ms2'\nx = {'ms': 1e-3}"))


# The table's rows as the control plane reads them: ModelScope is one row, and nothing else.
MS_SPEC = {
    "source": {"modelscope": {"repo": "Qwen/Qwen2.5-0.5B-Instruct", "token": {"secretRef": {"name": "ms", "key": "T"}}}},
    "storage": {"size": "1Gi", "storageClassName": "rwx"},
}  # fmt: skip


def _job_env_and_volumes(spec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    parent = modelcache("m", spec=spec, namespace="team-a")
    pod = download_job(parent, parse_spec(parent["spec"]), HooksConfig())["spec"]["template"]["spec"]
    env = {e["name"]: e.get("valueFrom", e.get("value")) for e in pod["containers"][0]["env"]}
    return env, pod.get("volumes", [])


def test_each_credential_shape_reaches_the_pvc_job_as_its_row_says() -> None:
    """TOKEN: one key as the row's variable; FILE: one key mounted; KEYS: the whole Secret."""
    env, volumes = _job_env_and_volumes(MS_SPEC)
    assert env[names.ENV_MODELSCOPE_TOKEN] == {"secretKeyRef": {"name": "ms", "key": "T"}}
    assert names.ENV_HF_TOKEN not in env and names.ENV_CREDENTIALS_DIR not in env
    assert not any(v.get("name") == "credentials" for v in volumes)
    by_uri = {"uri": "ms://org/name", "secretRef": {"name": "ms"}}
    env, _ = _job_env_and_volumes({**MS_SPEC, "source": by_uri})
    assert env[names.ENV_MODELSCOPE_TOKEN] == {"secretKeyRef": {"name": "ms", "key": "MODELSCOPE_API_TOKEN"}}
    env, volumes = _job_env_and_volumes(
        {**MS_SPEC, "source": {"uri": "s3://bkt/m", "secretRef": {"name": "s"}}}
    )
    assert names.ENV_CREDENTIALS_DIR in env and names.ENV_MODELSCOPE_TOKEN not in env
    assert {"name": "credentials", "secret": {"secretName": "s", "defaultMode": 0o440}} in volumes


def test_a_modelscope_source_reaches_the_node_copy_and_back() -> None:
    """parse_spec and parse_uri give a Source the sync hook writes on a ModelCacheNode
    (`to_dict`) and the agent reads back (`source_from_node_spec`) unchanged."""
    by_form = parse_spec(MS_SPEC).source
    assert (by_form.scheme, by_form.location, by_form.revision) == (
        "ms",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "master",
    )
    assert source_from_node_spec(by_form.to_dict()) == by_form
    assert by_form.to_dict()["uri"] == "ms://Qwen/Qwen2.5-0.5B-Instruct"
    by_uri, errors = parse_uri("ms://org/name:v1.0")
    assert by_uri is not None and not errors and by_uri.revision == "v1.0"
    assert source_from_node_spec(by_uri.to_dict()) == by_uri
    pinned = by_uri.with_revision("a" * 40)
    assert pinned.pinned and by_uri.resolves and not by_uri.pinned
    assert source_from_node_spec(pinned.to_dict()) == pinned


def test_a_modelscope_revision_rolls_and_nothing_else_of_it_changes() -> None:
    """The webhook's update rule reads the table: the form's revision may change, repo and token not."""
    old: dict[str, Any] = {
        "source": {"modelscope": {"repo": "org/m", "revision": "v1"}},
        "storage": {"size": "1Gi"},
    }
    moved = {**old, "source": {"modelscope": {"repo": "org/m", "revision": "v2"}}}
    assert immutable_changes(old, moved) == []
    other = {**old, "source": {"modelscope": {"repo": "org/other", "revision": "v1"}}}
    assert immutable_changes(old, other) == ["spec.source.modelscope.repo"]
    token = {"secretRef": {"name": "s", "key": "k"}}
    with_token = {**old, "source": {"modelscope": {**old["source"]["modelscope"], "token": token}}}
    assert immutable_changes(old, with_token) == ["spec.source.modelscope.token"]
    by_uri = {**old, "source": {"uri": "ms://org/m:v1"}}
    assert immutable_changes(by_uri, {**old, "source": {"uri": "ms://org/m:v2"}}) == []
    assert immutable_changes(by_uri, {**old, "source": {"uri": "ms://org/n:v1"}}) == ["spec.source.uri"]
