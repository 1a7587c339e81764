"""The agent's downloads use the proxies of the environment praesto-agent run started with
(AgentSettings.environment -> AgentSettings.downloads.proxies), not the process environment at the point of use:
every byte request of a download tunnels through HTTP_PROXY (#23 item 3). Once, JobRunner built
each download's Options without that environment, so an agent behind a proxy fetched directly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.download.api import EngineSettings

from praesto import names
from testkit.agent_harness import Env, env_context
from testkit.connect_proxy import connect_proxy
from testkit.kube_real import RealKube


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def test_byte_fetches_go_through_the_proxy_the_agent_started_with(env: Env) -> None:
    env.add_model("proxied", **{"config.json": b"{}", "model.safetensors": b"w" * 300_000})
    env.create_mcn("proxied")
    with connect_proxy() as (proxy, tunnels):
        env.start(environment=EngineSettings.from_environment({"HTTP_PROXY": proxy}))
        env.wait_phase("proxied", names.PHASE_READY)
    assert env.hub.endpoint.removeprefix("http://") in tunnels
