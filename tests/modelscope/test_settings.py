"""The ModelScope endpoint as a setting: flag, environment and chart value, like HF_ENDPOINT."""

from __future__ import annotations

import pytest
from praesto.agent import cli as agent_cli
from praesto.agent.budget.origin_budget import origin_host
from praesto.agent.download.api import Options, Plan
from praesto.agent.download.origins.modelscope.hubapi import DEFAULT_ENDPOINT, ENV_ENDPOINT, endpoint_of
from praesto.agent.settings import ENV_MODELSCOPE_ENDPOINT, AgentSettings, SettingsError

from praesto.spec import Source
from testkit.helm_chart import one, render_objects

MIRROR = "https://modelscope-mirror.example.com"


def _settings(env: dict[str, str], *flags: str) -> AgentSettings:
    args = agent_cli.build_parser(True, env).parse_args(["run", "--node-name=n", *flags])
    return AgentSettings.from_args(args, env)


def test_the_settings_and_the_origin_name_the_same_variable() -> None:
    assert ENV_MODELSCOPE_ENDPOINT == ENV_ENDPOINT == "MODELSCOPE_ENDPOINT"  # the client's own (config.py)


@pytest.mark.parametrize(
    ("env", "flags"), [({ENV_ENDPOINT: MIRROR}, ()), ({}, (f"--modelscope-endpoint={MIRROR}",))]
)
def test_flag_or_environment_reach_the_downloads(env: dict[str, str], flags: tuple[str, ...]) -> None:
    settings = _settings(env, *flags)
    assert settings.modelscope_endpoint == MIRROR
    assert endpoint_of(Options.of(settings.downloads)) == MIRROR  # what an agent download asks


def test_unset_is_modelscope_cn() -> None:
    settings = _settings({})
    assert settings.modelscope_endpoint is None
    assert endpoint_of(Options.of(settings.downloads)) == DEFAULT_ENDPOINT == "https://modelscope.cn"


def test_an_endpoint_that_is_not_a_url_is_refused_naming_the_flag() -> None:
    with pytest.raises(SettingsError, match=r"--modelscope-endpoint 'modelscope\.cn' .*not an http"):
        _settings({ENV_ENDPOINT: "modelscope.cn"})


def test_the_chart_value_sets_the_agents_variable() -> None:
    objects = render_objects({"downloader": {"modelscopeEndpoint": MIRROR}})
    (agent,) = [
        c for c in one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"
    ]
    assert {"name": ENV_ENDPOINT, "value": MIRROR} in agent["env"]
    default = render_objects({})
    (plain,) = [
        c for c in one(default, "DaemonSet")["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"
    ]
    assert ENV_ENDPOINT not in {e["name"] for e in plain["env"]}
    with pytest.raises(Exception, match="modelscopeEndpoint"):
        render_objects({"downloader": {"modelscopeEndpoint": "ftp://x"}})


def test_the_origin_budget_counts_the_endpoints_host() -> None:
    planned = Plan(source=Source("ms", "org/model", "master"), revision="a" * 40, files=())
    assert origin_host(planned, Options(modelscope_endpoint=MIRROR)) == "modelscope-mirror.example.com"
    assert origin_host(planned, Options()) == "modelscope.cn"
