"""allowPatterns / ignorePatterns are bounded on the API server itself (issue 37).

Every listed file is matched against every pattern, so the CRD caps the lists (maxItems) and each
pattern (maxLength) at praesto/spec.py's MAX_PATTERNS and MAX_PATTERN_CHARS: the real kube-apiserver
refuses one pattern more or one character more (422, before any webhook), and admits the largest
lists within them.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from praesto import names
from praesto.spec import MAX_PATTERN_CHARS, MAX_PATTERNS
from testkit.chart_install import ensure_namespace
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache

NS = "pattern-bounds"
LONGEST = "*" + "a" * (MAX_PATTERN_CHARS - 1)


def dry_run_create(installed: Installed, allow: list[str], ignore: list[str]) -> Any:
    ensure_namespace(installed.admin, NS)
    hf = {"repo": "org/tiny", "allowPatterns": allow, "ignorePatterns": ignore}
    body = modelcache("bounded", NS, source={"huggingface": hf})
    api = client.CustomObjectsApi(installed.admin.api)
    return api.create_namespaced_custom_object(
        names.GROUP, names.VERSION, NS, names.MODELCACHE_PLURAL, body, dry_run="All"
    )


@pytest.mark.parametrize("field", ["allowPatterns", "ignorePatterns"])
@pytest.mark.parametrize(
    ("patterns", "refusal"),
    [
        ([LONGEST] * (MAX_PATTERNS + 1), f"must have at most {MAX_PATTERNS} items"),
        (["*.json", LONGEST + "a"], f"may not be more than {MAX_PATTERN_CHARS} bytes"),
    ],
    ids=["one-pattern-too-many", "one-character-too-long"],
)
def test_the_api_server_refuses_a_pattern_list_over_its_bounds(
    installed: Installed, field: str, patterns: list[str], refusal: str
) -> None:
    lists = {"allowPatterns": ["*"], "ignorePatterns": []}
    lists[field] = patterns
    with pytest.raises(ApiException) as info:
        dry_run_create(installed, lists["allowPatterns"], lists["ignorePatterns"])
    assert info.value.status == 422, info.value.body
    assert f"spec.source.huggingface.{field}" in info.value.body and refusal in info.value.body


def test_the_largest_lists_within_the_bounds_are_admitted(installed: Installed) -> None:
    largest = [LONGEST[:-1] + str(i % 10) for i in range(MAX_PATTERNS)]
    admitted = dry_run_create(installed, largest, largest)
    assert admitted["spec"]["source"]["huggingface"]["allowPatterns"] == largest
