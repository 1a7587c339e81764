"""Chart nodeAgent.scrub: the agent container's scrub flags, their defaults, and the schema's refusals."""

from __future__ import annotations

import pytest
from helm_python.errors import HelmValuesError

from praesto import names
from testkit.helm_chart import one, render, render_objects


def agent_args(values: dict[str, object] | None = None) -> list[str]:
    daemonset = one(render_objects(values), "DaemonSet")
    container = next(
        c for c in daemonset["spec"]["template"]["spec"]["containers"] if "--node-name" in str(c)
    )
    return [str(a) for a in container["args"]]


def test_defaults_are_weekly_at_64_mebibytes_per_second() -> None:
    args = agent_args()
    assert f"--scrub-interval={names.DEFAULT_SCRUB_INTERVAL}" in args
    assert f"--scrub-bytes-per-second={names.DEFAULT_SCRUB_BYTES_PER_SECOND}" in args


def test_values_reach_the_flags_and_zero_disables() -> None:
    args = agent_args({"nodeAgent": {"scrub": {"interval": "0", "bytesPerSecond": "16Mi"}}})
    assert "--scrub-interval=0" in args and "--scrub-bytes-per-second=16Mi" in args


def test_a_bad_interval_is_refused_by_the_schema() -> None:
    with pytest.raises(HelmValuesError, match="/nodeAgent/scrub/interval"):
        render({"nodeAgent": {"scrub": {"interval": "weekly"}}})
