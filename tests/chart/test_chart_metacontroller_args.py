"""The chart gives Metacontroller a client rate limit sized for a fleet, and the tiers run at it.

metacontroller-helm 4.17.2 renders `commandArgs` as its container's args
(deploy/helm/metacontroller/templates/statefulset.yaml `toYaml .Values.commandArgs`); the
test-only stand-in subchart renders them the same way when asked
(testkit/metacontroller_subchart.py). Metacontroller's own defaults are 5 requests/s, burst 10
(pkg/cmd/metacontroller/main.go at v4.17.2): about N/5 seconds to create a cache's N copies.
"""

from __future__ import annotations

from pathlib import Path

import helm_python as helm

from praesto.quantity import parse_quantity
from testkit.client_rate_limit import MetacontrollerFlags
from testkit.helm_chart import one, parse_manifests
from testkit.metacontroller_subchart import (
    chart_copy_with_dependency,
    chart_metacontroller_flags,
    rendered_command_args,
    rendered_container,
)


def test_the_chart_raises_metacontrollers_client_rate_limit(tmp_path: Path) -> None:
    args = rendered_command_args(tmp_path)
    assert "--client-go-qps=50" in args
    assert "--client-go-burst=100" in args
    assert "--leader-election" in args  # the list replaces the subchart's: ours keeps what it needs
    flags = chart_metacontroller_flags(tmp_path / "again")
    assert (flags.client_go_qps, flags.client_go_burst) == (50.0, 100)
    assert flags.workers == 5  # Metacontroller's default: not set by the chart
    assert flags.cache_flush_interval == 1800.0


def test_users_who_replace_command_args_get_metacontrollers_defaults_back(tmp_path: Path) -> None:
    """Helm replaces lists: a user's commandArgs without the flags runs at client-go's 5/10."""
    args = rendered_command_args(tmp_path, {"metacontroller": {"commandArgs": ["--zap-log-level=2"]}})
    assert args == ["--zap-log-level=2"]
    flags = MetacontrollerFlags.from_args(args)
    assert (flags.client_go_qps, flags.client_go_burst) == (5.0, 10)


def test_the_subchart_alone_renders_metacontrollers_own_default_args(tmp_path: Path) -> None:
    """Negative control: the (stand-in of the) subchart's 4.17.2 defaults carry no rate limit."""
    chart = chart_copy_with_dependency(tmp_path)
    with helm.Chart.load(chart / "charts" / "metacontroller-helm") as sub:
        rendered = sub.render({"standinRenderWorkload": True}, name="praesto", namespace="praesto-system")
    args = one(parse_manifests(rendered), "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == [
        "--zap-log-level=4",
        "--discovery-interval=20s",
        "--cache-flush-interval=30m",
        "--health-probe-bind-address=:8081",
    ]
    flags = MetacontrollerFlags.from_args(args)
    assert (flags.client_go_qps, flags.client_go_burst, flags.workers) == (5.0, 10, 5)


GO_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def go_memory_limit(value: str) -> int:
    """GOMEMLIMIT's bytes: a number and one of Go's units (runtime/debug SetMemoryLimit's syntax)."""
    for unit in sorted(GO_UNITS, key=len, reverse=True):
        if value.endswith(unit) and value[: -len(unit)].isdigit():
            return int(value[: -len(unit)]) * GO_UNITS[unit]
    raise AssertionError(f"GOMEMLIMIT {value!r}: not <digits><unit> (Go's own syntax; 'Mi' is not one)")


def test_metacontrollers_go_memory_limit_sits_below_its_container_limit(tmp_path: Path) -> None:
    """Metacontroller holds every Pod, Node and copy of the cluster (docs/scale.md): its heap peaks
    ~1.5x what it keeps. GOMEMLIMIT makes Go collect before the container limit, not be killed at it."""
    container = rendered_container(tmp_path)
    env = {e["name"]: e["value"] for e in container["env"]}
    limit = parse_quantity(container["resources"]["limits"]["memory"])
    soft = go_memory_limit(env["GOMEMLIMIT"])
    assert 0.85 * limit <= soft <= 0.95 * limit, (soft, limit)  # room for Go's stacks and the runtime
    assert parse_quantity(container["resources"]["requests"]["memory"]) <= limit
