"""`praesto-agent run`'s settings (#23 item 3): one typed tree from flags over environment, built at
the edge (cli.main), every default the field's own, every refusal naming the flag and its fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from praesto.agent import cli
from praesto.agent.budget.origin_budget import BudgetConfig
from praesto.agent.credentials import CredentialPolicy
from praesto.agent.download.api import EngineSettings, StoreEnvironment
from praesto.agent.peers.auth import Pod
from praesto.agent.peers.limits import Limits
from praesto.agent.settings import AgentSettings, MetricsSettings, SettingsError, StartupTaintSettings

from praesto import credscope, quota

PEER_ENV = {
    "PRAESTO_PEER_PORT": "9200",
    "POD_IP": "fd00::7",
    "POD_NAME": "agent-x",
    "POD_UID": "u-1",
    "PRAESTO_PEER_SERVICE_ACCOUNT": "praesto-system/praesto-node-agent",
    "PRAESTO_PEER_MAX_UPLOADS": "3",
    "PRAESTO_PEER_UPLOAD_RATE": "200Mi",
    "PRAESTO_PEER_MAX_CONNECTIONS": "64",
    "PRAESTO_PEER_MAX_CONNECTIONS_PER_CLIENT": "5",
    "PRAESTO_PEER_IDLE_TIMEOUT": "20",
    "PRAESTO_PEER_REQUEST_TIMEOUT": "4.5",
    "PRAESTO_PEER_MIN_SEND_RATE": "1Mi",
}
BUDGET_ENV = {
    "PRAESTO_ORIGIN_BUDGET_NAMESPACE": "praesto-system",
    "PRAESTO_ORIGIN_BUDGET_MAX_NODES": "4",
    "PRAESTO_ORIGIN_BUDGET_PER_HOST": "2",
    "PRAESTO_ORIGIN_BUDGET_BYTES_PER_SECOND": "1Gi",
    "PRAESTO_ORIGIN_BUDGET_LEASE_SECONDS": "45",
    "PRAESTO_ORIGIN_BUDGET_MAX_RETRY_AFTER_SECONDS": "300",
    "PRAESTO_ORIGIN_BUDGET_POLL_SECONDS": "0.5",
}
ENV = {
    "NODE_NAME": "worker-1",
    "PRAESTO_LOG_LEVEL": "DEBUG",
    "PRAESTO_BASE_PATH": "/mnt/ssd/praesto",
    "PRAESTO_CONCURRENCY": "4",
    "PRAESTO_MAX_PARALLEL_CACHES": "3",
    "PRAESTO_RESERVE": "10%",
    "PRAESTO_METRICS_PORT": "9100",
    "PRAESTO_METRICS_ADDRESS": "127.0.0.1",
    "PRAESTO_METRICS_FROM": "any",
    "HF_ENDPOINT": "https://hf-mirror.example.com",
    "PRAESTO_CA_BUNDLE": "/etc/praesto/ca/ca.crt",
    "KUBECONFIG": "/home/dev/.kube/config",
    "PRAESTO_STARTUP_TAINT_KEY": "example.com/cold",
    "PRAESTO_STARTUP_TAINT_DEADLINE": "600",
    "PRAESTO_WARM_NAMESPACES": "team-a, team-b",
    "PRAESTO_CREDENTIALS_SECRET": "praesto-system/cloud-creds",
    "PRAESTO_CREDENTIALS_NAMESPACES": "team-a",
    "PRAESTO_CREDENTIALS_SOURCES": "s3://models/",
    "PRAESTO_NAMESPACE_QUOTAS": '{"default": "100Gi", "namespaces": {"team-a": "1Ti"}}',
    **PEER_ENV,
    **BUDGET_ENV,
}


def settings(env: dict[str, str], *flags: str) -> AgentSettings:
    """As cli.main builds them: the parser's defaults from `env`, then AgentSettings over both."""
    return AgentSettings.from_args(cli.build_parser(True, env).parse_args(["run", *flags]), env)


def test_the_defaults_are_the_fields_own() -> None:
    assert settings({}, "--node-name=n") == AgentSettings(node_name="n")
    assert settings({"NODE_NAME": "n"}) == AgentSettings(node_name="n")  # no download variable: nothing kept


def test_every_variable_reaches_its_field() -> None:
    got = settings(ENV)
    assert got == AgentSettings(
        node_name="worker-1",
        base_path=Path("/mnt/ssd/praesto"),
        kubeconfig="/home/dev/.kube/config",
        log_level="DEBUG",
        hf_endpoint="https://hf-mirror.example.com",
        ca_bundle="/etc/praesto/ca/ca.crt",
        concurrency=4,
        max_parallel_caches=3,
        reserve="10%",
        metrics=MetricsSettings(9100, "127.0.0.1", "any"),
        startup_taint=StartupTaintSettings("example.com/cold", 600.0, ("team-a", "team-b")),
        peers=got.peers,  # below, field by field
        origin_budget=BudgetConfig("praesto-system", 4, 2, 1 << 30, 45, 300.0, 0.5),
        credentials=CredentialPolicy(
            credscope.CredentialScope(("team-a",), ("s3://models/",)), ("praesto-system", "cloud-creds")
        ),
        quotas=quota.Quotas(100 << 30, {"team-a": 1 << 40}),
        environment=EngineSettings.from_environment(ENV),
    )
    assert got.peers is not None
    assert (got.peers.address, got.peers.bind) == ("[fd00::7]:9200", ("::", 9200))
    assert got.peers.pod == Pod("praesto-system", "agent-x", "u-1", "praesto-node-agent")
    assert got.peers.service_account == "praesto-system/praesto-node-agent"
    assert got.peers.limits == Limits(3, 200 << 20, 64, 5, 20.0, 4.5, 1 << 20)
    downloads = got.downloads  # the section every download takes whole (agent/jobs.py)
    assert (downloads.endpoint, downloads.concurrency, downloads.ca_bundle, downloads.store_environment) == (
        "https://hf-mirror.example.com", 4, "/etc/praesto/ca/ca.crt", StoreEnvironment.of(ENV),
    )  # fmt: skip
    assert downloads is got.downloads  # built once


@pytest.mark.parametrize(
    ("variable", "flag", "field"),
    [
        ("NODE_NAME", "--node-name=w2", lambda s: s.node_name == "w2"),
        ("PRAESTO_CONCURRENCY", "--concurrency=6", lambda s: s.concurrency == 6),
        ("PRAESTO_METRICS_FROM", "--metrics-from=local", lambda s: s.metrics.allowed_from == "local"),
        ("PRAESTO_STARTUP_TAINT_KEY", "--startup-taint-key=", lambda s: s.startup_taint.key == ""),
        ("PRAESTO_WARM_NAMESPACES", "--warm-namespaces=", lambda s: s.startup_taint.warm_namespaces == ()),
        ("PRAESTO_PEER_PORT", "--peer-port=0", lambda s: s.peers is None),
        ("PRAESTO_ORIGIN_BUDGET_NAMESPACE", "--origin-budget-namespace=", lambda s: s.origin_budget is None),
        ("PRAESTO_LOG_LEVEL", "--log-level=ERROR", lambda s: s.log_level == "ERROR"),
    ],
)
def test_a_flag_wins_over_its_variable(variable: str, flag: str, field: Any) -> None:
    assert variable in ENV
    argv = ["--log-level=ERROR", "run"] if flag.startswith("--log-level") else ["run", flag]
    parsed = cli.build_parser(True, ENV).parse_args(argv)
    assert field(AgentSettings.from_args(parsed, ENV))


@pytest.mark.parametrize(
    ("env", "refusal"),
    [
        ({"NODE_NAME": ""}, "--node-name: Required value; set it or NODE_NAME (fieldRef spec.nodeName in the DaemonSet)"),
        ({"PRAESTO_METRICS_PORT": "70000"}, "--metrics-port: 70000 is not a port; use 1-65535, or 0 to disable"),
        ({"PRAESTO_RESERVE": "lots"}, "--reserve: "),
        ({"PRAESTO_SCRUB_INTERVAL": "weekly"}, "--scrub-interval: 'weekly' is not a duration"),
        ({"PRAESTO_SCRUB_BYTES_PER_SECOND": "fast"}, "--scrub-bytes-per-second: 'fast'"),
        ({"PRAESTO_SCRUB_BYTES_PER_SECOND": "0"}, "--scrub-bytes-per-second: '0' (it must be positive)"),
        ({"PRAESTO_WARM_NAMESPACES": "Team_A"}, "--warm-namespaces: Team_A is not a namespace name"),
        ({"PRAESTO_NAMESPACE_QUOTAS": "{"}, "PRAESTO_NAMESPACE_QUOTAS: not JSON"),
        ({**PEER_ENV, "POD_IP": ""}, "--peer-address: Required value with --peer-port; set POD_IP"),
        ({**BUDGET_ENV, "PRAESTO_ORIGIN_BUDGET_LEASE_SECONDS": "1"}, "--origin-budget-lease-seconds: 1 is under 3"),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_naming_the_flag_or_variable_and_the_fix(
    env: dict[str, str], refusal: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        settings({"NODE_NAME": "n", **env})
    assert str(refused.value).startswith(refusal)


def test_scrub_settings_reach_the_agent_and_zero_disables() -> None:
    default = settings({"NODE_NAME": "n"}).scrub
    assert (default.interval_seconds, default.bytes_per_second) == (168 * 3600.0, 64 << 20)
    chosen = settings({"NODE_NAME": "n", "PRAESTO_SCRUB_INTERVAL": "24h"}, "--scrub-bytes-per-second=128Mi")
    assert (chosen.scrub.interval_seconds, chosen.scrub.bytes_per_second) == (86400.0, 128 << 20)
    assert settings({"NODE_NAME": "n"}, "--scrub-interval=0").scrub.interval_seconds == 0.0


def test_the_write_mode_reaches_the_downloads_and_a_bad_one_is_refused() -> None:
    # one name, from the flag to the engine (download/api.py WRITE_MODES)
    assert settings({"NODE_NAME": "n"}).downloads.write_mode == "direct"  # O_DIRECT on a local disk
    assert settings({"NODE_NAME": "n", "PRAESTO_WRITE_MODE": "buffered"}).downloads.write_mode == "buffered"
    assert (
        settings({"NODE_NAME": "n", "PRAESTO_WRITE_MODE": "buffered"}, "--write-mode=direct").write_mode
        == "direct"
    )
    with pytest.raises(SettingsError) as refused:
        settings({"NODE_NAME": "n", "PRAESTO_WRITE_MODE": "odirect"})
    assert str(refused.value) == "--write-mode (PRAESTO_WRITE_MODE): 'odirect' is not one of direct, buffered"


def test_a_value_of_the_wrong_type_in_the_environment_is_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        settings({"NODE_NAME": "n", "PRAESTO_CONCURRENCY": "many"})
    assert exited.value.code == 2
    assert "--concurrency: invalid int value: 'many'" in capsys.readouterr().err


def test_the_process_edge_reads_its_environment_once_and_refuses_a_bad_value(tmp_path: Path) -> None:
    """`praesto-agent run` as the DaemonSet runs it: the variable comes from the process's own
    environment, and the refusal names the flag, the value and the fix; exit 2 before any API call."""
    env = {**os.environ, "NODE_NAME": "n", "PRAESTO_METRICS_PORT": "70000"}
    proc = subprocess.run(
        [sys.executable, "-m", "praesto.agent.cli", "run", "--base-path", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--metrics-port: 70000 is not a port; use 1-65535, or 0 to disable" in proc.stderr
