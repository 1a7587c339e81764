"""Chart value namespaceQuota reaches the validating webhook and the node agent as the same setting."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
from praesto.hooks.config import HooksConfig

from praesto import quota
from testkit.helm_chart import one, render, render_objects

GiB = 2**30


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_quota_reaches_hooks_and_agent_and_parses_the_same() -> None:
    objects = render_objects(
        {"namespaceQuota": {"default": "500Gi", "namespaces": {"team-a": "2Ti", "sandbox": 0}}}
    )
    hooks = one(objects, "Deployment", "praesto-hooks")["spec"]["template"]["spec"]["containers"][0]
    agent = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    expected = quota.Quotas(500 * GiB, {"team-a": 2 * 1024 * GiB, "sandbox": 0})
    assert [quota.parse_quotas(_env(c)[quota.ENV]) for c in (hooks, agent)] == [expected, expected]
    assert HooksConfig.from_env(_env(hooks)).quotas == expected  # the sync hook enforces it too


def test_no_quota_by_default() -> None:
    hooks = one(render_objects({}), "Deployment", "praesto-hooks")["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert not quota.parse_quotas(_env(hooks)[quota.ENV]).enabled


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"default": "lots"}, "/namespaceQuota/default"),
        ({"namespaces": {"Team_A": "1Gi"}}, "invalid propertyName 'Team_A'"),
    ],
)
def test_schema_refuses_a_malformed_quota(value: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render({"namespaceQuota": value})
    assert where in str(err.value)
