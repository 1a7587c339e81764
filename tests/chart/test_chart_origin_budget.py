"""Chart value originBudget: off by default; when on, the agent's flags, a namespaced Lease Role and its policy."""

from __future__ import annotations

import argparse
from typing import Any

import helm_python as helm
import pytest
from praesto.agent.budget.config import add_budget_arguments, check_budget_arguments

from praesto import names, rbac
from testkit.helm_chart import NAMESPACE, find, one, render, render_objects
from tests.chart.test_chart_rbac import bound_roles, declared, granted
from tests.chart.test_chart_render import validate_object

ON = {"originBudget": {"enabled": True, "maxNodes": 2, "perHost": 1, "bytesPerSecond": "1Gi"}}


def _agent_args(objects: list[dict[str, Any]]) -> list[str]:
    return list(one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"])


def _budget_flags(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_budget_arguments(parser, {})
    parsed, _ = parser.parse_known_args(args)
    return parsed


def test_off_by_default_no_flags_no_lease_grant() -> None:
    objects = render_objects()
    assert not [a for a in _agent_args(objects) if a.startswith("--origin-budget")]
    assert not [r for r in find(objects, "Role") if r["metadata"]["name"].endswith("origin-budget")]
    assert _budget_flags([]).origin_budget_namespace == ""


def test_on_the_agent_gets_the_values_as_flags_that_it_accepts() -> None:
    parsed = _budget_flags(_agent_args(render_objects(ON)))
    assert parsed.origin_budget_namespace == NAMESPACE
    assert (parsed.origin_budget_max_nodes, parsed.origin_budget_per_host) == (2, 1)
    assert parsed.origin_budget_bytes_per_second == "1Gi"
    assert (parsed.origin_budget_lease_seconds, parsed.origin_budget_poll_seconds) == (30, 2.0)
    assert check_budget_arguments(parsed) is None


def test_on_the_lease_grant_is_a_role_in_the_release_namespace_exactly_as_declared() -> None:
    objects = render_objects(ON)
    for obj in objects:
        validate_object(obj)
    agent_sa = one(objects, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    role = one(objects, "Role", "praesto-node-agent-origin-budget")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role in bound_roles(objects, agent_sa)
    assert granted(role) == declared(rbac.AGENT_ORIGIN_BUDGET)
    others: set[tuple[str, str, str]] = set()
    for other in bound_roles(objects, agent_sa):
        if other is not role:
            others |= granted(other)
    assert others == declared(rbac.AGENT) | declared(rbac.AGENT_PEERS)  # the ClusterRole gains nothing
    policy = one(objects, "ValidatingAdmissionPolicy", "praesto-node-agent-origin-budget")
    assert any(names.ORIGIN_LEASE_PREFIX in v["expression"] for v in policy["spec"]["validations"])
    assert one(objects, "ValidatingAdmissionPolicyBinding", "praesto-node-agent-origin-budget")


def test_a_rate_without_max_nodes_is_refused_by_the_agent_naming_the_value() -> None:
    values = {"originBudget": {"enabled": True, "maxNodes": 0, "bytesPerSecond": "1Gi"}}
    problem = check_budget_arguments(_budget_flags(_agent_args(render_objects(values))))
    assert problem is not None and "originBudget.maxNodes" in problem


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"maxNodes": -1}, "/originBudget/maxNodes"),
        ({"bytesPerSecond": "fast"}, "/originBudget/bytesPerSecond"),
        ({"leaseDurationSeconds": 1}, "/originBudget/leaseDurationSeconds"),
        ({"slots": 3}, "slots"),
    ],
)
def test_schema_refuses_a_malformed_budget(value: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render({"originBudget": value})
    assert where in str(err.value)
