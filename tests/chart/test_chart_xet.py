"""downloads.xet.enabled reaches both downloaders (issue 40): the node agent's env, and the PVC-mode
download Job through praesto.downloadEnvMap, which the hooks hand to every Job they build; the Job's
own CLI (`praesto-agent download`) then reads PRAESTO_XET as its --xet default."""

from __future__ import annotations

from typing import Any

import pytest
from praesto.agent.cli import build_parser
from praesto.agent.download.settings import DownloadSettings
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc_job import download_job

from praesto import names
from praesto.spec import parse_spec
from testkit.helm_chart import one, render_objects
from testkit.hook_objects import modelcache
from tests.hooks.schemas import validate_child

PVC_SPEC = {"source": {"uri": "hf://org/tiny"}, "storage": {"size": "1Gi", "storageClassName": "rwx"}}


def job_env(objects: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """The env and args of the download Job the hooks, configured as the chart rendered them, build."""
    hooks = one(objects, "Deployment", "praesto-hooks")["spec"]["template"]["spec"]["containers"][0]
    config = HooksConfig.from_env({e["name"]: e["value"] for e in hooks["env"] if "value" in e})
    parent = modelcache("tiny", spec=PVC_SPEC, namespace="team-a")
    job = download_job(parent, parse_spec(parent["spec"]), config)
    validate_child(job)
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}, container["args"]


def agent_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    container = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


@pytest.mark.parametrize("enabled", [True, False])
def test_the_pvc_mode_job_and_the_agent_get_xet_as_the_chart_says(enabled: bool) -> None:
    objects = render_objects({"downloads": {"xet": {"enabled": enabled}}})
    env, args = job_env(objects)
    assert (env.get(names.ENV_XET) == "true") is enabled
    assert (agent_env(objects).get(names.ENV_XET) == "true") is enabled
    parsed = build_parser(False, {}).parse_args(args)  # the real CLI takes the Job's args
    assert parsed.xet is None  # no flag: the Job's env decides (cli_download.py)
    assert DownloadSettings.from_env(env).xet is enabled
