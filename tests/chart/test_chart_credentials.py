"""Chart-level credential rules (issue 7): each refusal renders an error with its cause and fix,
and a valid setting reaches the node agent, the hooks (for the PVC Job) and RBAC exactly."""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import pytest
from praesto.agent.credentials import (
    CLUSTER_CREDENTIALS_NAMESPACES_ENV,
    CLUSTER_CREDENTIALS_SOURCES_ENV,
    CLUSTER_SECRET_ENV,
)
from praesto.agent.download.origins.objstore.creds import ENV_CA_FILE, ENV_IDENTITY
from praesto.hooks.config import HooksConfig

from praesto import rbac
from praesto.credscope import CredentialScope
from testkit.helm_chart import find, one, render, render_objects
from tests.chart.test_chart_rbac import bound_roles, declared, granted
from tests.chart.test_chart_render import validate_object

AZURE = {"azure.workload.identity/client-id": "00000000-0000-0000-0000-000000000000"}
AZURE_LABEL = {"azure.workload.identity/use": "true"}


@pytest.mark.parametrize(
    ("credentials", "cause", "fix"),
    [
        (
            {"identity": {"serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}},
             "secretRef": {"name": "cloud-creds"}},
            "identity and secretRef are both set",
            "remove the other",
        ),
        (
            {"identity": {"serviceAccountAnnotations": {"example.com/role": "x"}}},
            "no workload-identity annotation is set",
            "add eks.amazonaws.com/role-arn (AWS IRSA), iam.gke.io/gcp-service-account (GKE)",
        ),
        (
            {"identity": {"serviceAccountLabels": AZURE_LABEL}},
            "no workload-identity annotation is set",
            "azure.workload.identity/client-id (Azure)",
        ),
        (
            {"identity": {"serviceAccountAnnotations": AZURE}},
            "azure.workload.identity/client-id is set without the label",
            'add that label',
        ),
        (  # issue 21 item 2: the downloader identity only where the cluster's credentials may serve
            {"namespaces": ["team-a"],
             "identity": {"serviceAccountAnnotations": AZURE, "serviceAccountLabels": AZURE_LABEL,
                          "downloaderNamespaces": ["team-a", "team-b"]}},
            "downloaderNamespaces: team-b is not in credentials.namespaces",
            "add team-b to credentials.namespaces or remove it from downloaderNamespaces",
        ),
        (
            {"identity": {"serviceAccountAnnotations": AZURE, "serviceAccountLabels": {"azure.workload.identity/use": "false"}}},
            "without the label azure.workload.identity/use",
            "add that label",
        ),
    ],
)  # fmt: skip
def test_template_refusals_name_cause_and_fix(credentials: dict[str, Any], cause: str, fix: str) -> None:
    with pytest.raises(helm.HelmError) as err:
        render({"credentials": credentials})
    assert cause in str(err.value) and fix in str(err.value)


@pytest.mark.parametrize("name", ["Cloud_Creds", "-creds", "creds.", "a" * 254])
def test_schema_refuses_a_malformed_secret_name(name: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render({"credentials": {"secretRef": {"name": name}}})
    assert "/credentials/secretRef/name" in str(err.value)


def test_schema_refuses_unknown_keys_and_bad_proxies() -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render({"credentials": {"identiy": {}}})
    assert "identiy" in str(err.value)
    with pytest.raises(helm.HelmValuesError) as err:
        render({"downloads": {"proxy": {"httpsProxy": "proxy:3128"}}})
    assert "/downloads/proxy/httpsProxy" in str(err.value)


def _agent_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    container = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _hooks_config(objects: list[dict[str, Any]]) -> HooksConfig:
    container = one(objects, "Deployment", "praesto-hooks")["spec"]["template"]["spec"]["containers"][0]
    return HooksConfig.from_env({e["name"]: e["value"] for e in container["env"] if "value" in e})


def test_cluster_secret_is_read_by_the_agent_only_through_one_named_grant() -> None:
    values = {"credentials": {"secretRef": {"name": "cloud-creds"}}}
    objects = render_objects(values)
    for obj in objects:
        validate_object(obj)
    assert _agent_env(objects)[CLUSTER_SECRET_ENV] == "praesto-system/cloud-creds"
    agent_sa = one(objects, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    roles = bound_roles(objects, agent_sa)
    role = one(objects, "Role", "praesto-credentials-reader")
    assert role in roles and role["metadata"]["namespace"] == "praesto-system"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["cloud-creds"], "verbs": ["get"]}
    ]
    others: set[tuple[str, str, str]] = set()
    for other in roles:
        if other is not role:
            others |= granted(other)
    assert others == declared(rbac.AGENT) | declared(rbac.AGENT_PEERS)  # everything else unchanged
    assert ENV_IDENTITY not in _agent_env(objects)


def test_identity_reaches_both_service_accounts_and_pods() -> None:
    identity = {
        "serviceAccountAnnotations": AZURE,
        "serviceAccountLabels": AZURE_LABEL,
        "downloaderNamespaces": ["team-a", "team-b"],
    }
    objects = render_objects({"credentials": {"identity": identity, "namespaces": ["team-a", "team-b"]}})
    for obj in objects:
        validate_object(obj)
    agent_sa = one(objects, "ServiceAccount", "praesto-node-agent")
    assert agent_sa["metadata"]["annotations"] == AZURE
    downloaders = [
        sa for sa in find(objects, "ServiceAccount") if sa["metadata"]["name"] == "praesto-downloader"
    ]
    assert sorted(sa["metadata"]["namespace"] for sa in downloaders) == ["team-a", "team-b"]
    assert all(sa["metadata"]["labels"]["azure.workload.identity/use"] == "true" for sa in downloaders)
    pod = one(objects, "DaemonSet")["spec"]["template"]
    assert pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert _agent_env(objects)[ENV_IDENTITY] == "true"
    config = _hooks_config(objects)  # what the hooks parse is what the Job gets
    assert config.downloader_service_account == "praesto-downloader"
    assert config.downloader_pod_labels == AZURE_LABEL and config.downloader_env == {ENV_IDENTITY: "true"}
    assert not [
        r for r in find(objects, "Role") if "secrets" in str(r["rules"])
    ]  # no Secret grant in identity mode


def test_mirror_ca_bundle_and_proxies_reach_agent_and_job() -> None:
    values = {
        "downloader": {
            "hfEndpoint": "https://hf-mirror.internal",
            "modelscopeEndpoint": "https://ms.internal",
        },
        "downloads": {
            "caBundle": {"configMapName": "corporate-ca", "key": "bundle.pem"},
            "proxy": {"httpsProxy": "http://proxy:3128", "noProxy": ".svc,.cluster.local"},
        },
    }
    objects = render_objects(values)
    env = _agent_env(objects)
    assert env["HF_ENDPOINT"] == "https://hf-mirror.internal"
    assert env["MODELSCOPE_ENDPOINT"] == "https://ms.internal"
    assert env["HTTPS_PROXY"] == "http://proxy:3128" and env["NO_PROXY"] == ".svc,.cluster.local"
    assert env[ENV_CA_FILE] == env["SSL_CERT_FILE"] == "/etc/praesto/ca/ca.crt"
    volumes = one(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    ca = next(v for v in volumes if v["name"] == "ca-bundle")
    assert ca["configMap"] == {"name": "corporate-ca", "items": [{"key": "bundle.pem", "path": "ca.crt"}]}
    config = _hooks_config(objects)
    assert config.ca_bundle_configmap == ("corporate-ca", "bundle.pem")
    assert config.hf_endpoint == "https://hf-mirror.internal"
    assert config.modelscope_endpoint == "https://ms.internal"  # the PVC-mode Job's MODELSCOPE_ENDPOINT
    assert json.loads(json.dumps(config.downloader_env)) == {
        "HTTPS_PROXY": "http://proxy:3128",
        "NO_PROXY": ".svc,.cluster.local",
    }


def test_cluster_credentials_serve_only_the_listed_namespaces() -> None:
    default = _agent_env(render_objects())
    assert default[CLUSTER_CREDENTIALS_NAMESPACES_ENV] == ""  # none by default: every namespace is a tenant
    listed = _agent_env(render_objects({"credentials": {"namespaces": ["ml-prod", "ml-dev"]}}))
    assert listed[CLUSTER_CREDENTIALS_NAMESPACES_ENV] == "ml-prod,ml-dev"


def test_agent_and_hooks_apply_one_credential_scope() -> None:
    """Issue 21 item 2: the node agent (local mode) and the hooks (the PVC-mode Job) read the same
    namespaces and sources, and decide with the same rule (praesto/credscope.py)."""
    identity = {"serviceAccountAnnotations": AZURE, "serviceAccountLabels": AZURE_LABEL}
    values = {"credentials": {"identity": identity, "namespaces": ["ml-prod"], "sources": ["s3://models"]}}
    objects = render_objects(values)
    agent = CredentialScope.from_env(_agent_env(objects))
    assert _hooks_config(objects).credential_scope == agent == CredentialScope(("ml-prod",), ("s3://models",))
    assert agent.entitled("ml-prod", "s3://models/llama")
    assert not agent.entitled("ml-prod", "s3://models-private/llama")
    assert not agent.entitled("team-x", "s3://models/llama")


def test_cluster_credentials_can_be_narrowed_to_source_prefixes() -> None:
    assert _agent_env(render_objects())[CLUSTER_CREDENTIALS_SOURCES_ENV] == ""  # any source by default
    values = {"credentials": {"namespaces": ["ml-prod"], "sources": ["hf://my-org/", "s3://models/shared/"]}}
    assert (
        _agent_env(render_objects(values))[CLUSTER_CREDENTIALS_SOURCES_ENV]
        == "hf://my-org/,s3://models/shared/"
    )


def test_metadata_egress_is_denied_to_downloaders_by_default() -> None:
    """Issue 21 item 1: the chart offers egress denial to the metadata address (on by default)."""
    assert _hooks_config(render_objects()).denied_egress == ("169.254.169.254/32", "fd00:ec2::254/128")
    off = render_objects({"downloader": {"metadataEgress": {"deny": False}}})
    assert _hooks_config(off).denied_egress == ()
    with pytest.raises(helm.HelmError):
        render({"downloader": {"metadataEgress": {"cidrs": ["metadata.internal"]}}})
