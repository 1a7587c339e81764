"""Where downloads may connect (issue 37 item 3): downloads.egress.allowedCIDRs reaches the agent and
every PVC-mode Job, and the agent Pods get an egress NetworkPolicy keeping them off the metadata
addresses, like each downloader Job's (hooks/pvc_job.py metadata_egress_policy)."""

from __future__ import annotations

import ipaddress
from typing import Any

import helm_python as helm
import pytest
from praesto.agent.download.egress import ENV_ALLOWED, EgressPolicy
from praesto.agent.download.settings import DownloadSettings
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc_job import download_job

from praesto.spec import parse_spec
from testkit.helm_chart import find, render, render_objects
from testkit.hook_objects import modelcache
from tests.chart.test_chart_render import validate_object
from tests.test_settings_inventory import agent_settings

ALLOWED = ["10.20.0.0/16", "fd00:20::/64"]
METADATA = ("169.254.169.254/32", "fd00:ec2::254/128")  # downloader.metadataEgress.cidrs' default


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def _containers(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    (workload,) = [
        o for o in find(objects, kind) if kind != "Deployment" or o["metadata"]["name"] == "praesto-hooks"
    ]
    return list(workload["spec"]["template"]["spec"]["containers"])


def test_the_allowed_networks_reach_the_agent_and_each_downloader_job() -> None:
    objects = render_objects({"downloads": {"egress": {"allowedCIDRs": ALLOWED}}})
    agent = _env(_containers(objects, "DaemonSet")[0])
    assert agent[ENV_ALLOWED] == ",".join(ALLOWED)
    assert agent_settings(agent).egress == EgressPolicy.from_text(",".join(ALLOWED))
    hooks = HooksConfig.from_env(_env(_containers(objects, "Deployment")[0]))
    cache = modelcache("llm", namespace="team-a", spec={"source": {"uri": "oci://registry.team-a.svc/m:1"},
                                                         "storage": {"size": "1Gi", "storageClassName": "rwx"}})  # fmt: skip
    job = download_job(cache, parse_spec(cache["spec"]), hooks)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert DownloadSettings.from_env(_env(container)).egress_allowed_cidrs == ",".join(ALLOWED)
    # none listed: neither process gets the variable, and both refuse every internal address
    default = render_objects()
    assert ENV_ALLOWED not in _env(_containers(default, "DaemonSet")[0])
    assert agent_settings({}).egress == EgressPolicy()
    with pytest.raises(helm.HelmError):
        render({"downloads": {"egress": {"allowedCIDRs": ["in-cluster"]}}})


def _agent_egress_policy(values: dict[str, Any] | None = None) -> dict[str, Any] | None:
    found = [p for p in find(render_objects(values), "NetworkPolicy") if "Egress" in p["spec"]["policyTypes"]]
    assert len(found) <= 1
    return found[0] if found else None


def test_the_agent_pods_may_not_reach_the_metadata_addresses() -> None:
    policy = _agent_egress_policy()
    assert policy is not None
    validate_object(policy)
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "node-agent"
    (rule,) = policy["spec"]["egress"]
    blocks = {
        p["ipBlock"]["cidr"]: tuple(p["ipBlock"].get("except", ())) for p in rule["to"] if "ipBlock" in p
    }
    assert blocks == {"0.0.0.0/0": METADATA[:1], "::/0": METADATA[1:]}
    assert {"namespaceSelector": {}} in rule["to"]  # the API server's Service, DNS, peers stay reachable
    for cidr in (c for excepted in blocks.values() for c in excepted):
        assert ipaddress.ip_network(cidr).num_addresses == 1
    assert _agent_egress_policy({"nodeAgent": {"metadataEgress": {"deny": False}}}) is None
    # GKE serves workload identity at the metadata address: the agent keeps it then
    identity = {
        "credentials": {"identity": {"serviceAccountAnnotations": {"iam.gke.io/gcp-service-account": "a@b"}}}
    }
    assert _agent_egress_policy(identity) is None
