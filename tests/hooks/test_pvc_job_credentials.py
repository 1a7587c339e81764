"""PVC-mode Job wiring for issue 7: size cap, credentials Secret as files, identity, CA, proxies."""

from __future__ import annotations

from typing import Any

import pytest
from praesto.agent.cli import build_parser
from praesto.hooks.config import ConfigError, HooksConfig
from praesto.hooks.pvc import _job_state, pvc_pass
from praesto.hooks.pvc_job import CA_FILE, CREDENTIALS_DIR, download_job
from praesto.hooks.views import SyncRequest

from praesto import names
from praesto.spec import parse_spec
from testkit.hook_objects import NOW, modelcache
from tests.hooks.schemas import validate_child

S3_SPEC = {
    "source": {"uri": "s3://models/llama/v1", "secretRef": {"name": "s3-creds"}},
    "storage": {"size": "20Gi", "storageClassName": "rwx"},
}


def _job(config: HooksConfig, spec: dict[str, object] = S3_SPEC) -> dict[str, object]:
    parent = modelcache("llm", spec=spec, namespace="team-a")
    job = download_job(parent, parse_spec(parent["spec"]), config)
    validate_child(job)
    return job


def test_object_store_secret_is_mounted_as_files_and_size_is_capped() -> None:
    job = _job(HooksConfig())
    pod = job["spec"]["template"]["spec"]  # type: ignore[index]
    container = pod["containers"][0]
    args = build_parser(False, {}).parse_args(container["args"])  # the real CLI accepts them
    assert args.max_bytes == "20Gi" and args.source == "s3://models/llama/v1"
    assert {"name": "PRAESTO_CREDENTIALS_DIR", "value": CREDENTIALS_DIR} in container["env"]
    assert "envFrom" not in container
    assert {"name": "credentials", "secret": {"secretName": "s3-creds", "defaultMode": 0o440}} in pod[
        "volumes"
    ]
    assert {"name": "credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True} in container[
        "volumeMounts"
    ]
    assert "serviceAccountName" not in pod


def test_identity_ca_bundle_and_proxies_reach_the_job() -> None:
    config = HooksConfig.from_env(
        {
            "PRAESTO_DOWNLOADER_ENV": '{"HTTPS_PROXY": "http://proxy:3128", "PRAESTO_WORKLOAD_IDENTITY": "true"}',
            "PRAESTO_DOWNLOADER_SERVICE_ACCOUNT": "praesto-downloader",
            "PRAESTO_DOWNLOADER_POD_LABELS": '{"azure.workload.identity/use": "true"}',
            "PRAESTO_CA_BUNDLE_CONFIGMAP": "corporate-ca/ca.crt",
            "PRAESTO_CREDENTIALS_NAMESPACES": "team-a",
        }
    )
    job = _job(
        config, {"source": {"uri": "az://weights/m"}, "storage": {"size": "1Gi", "storageClassName": "rwx"}}
    )
    template = job["spec"]["template"]  # type: ignore[index]
    pod = template["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["HTTPS_PROXY"] == "http://proxy:3128" and env["PRAESTO_WORKLOAD_IDENTITY"] == "true"
    assert env["PRAESTO_CA_BUNDLE"] == CA_FILE == env["SSL_CERT_FILE"]
    assert pod["serviceAccountName"] == "praesto-downloader"
    assert template["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    ca = next(v for v in pod["volumes"] if v["name"] == "ca-bundle")
    assert ca["configMap"] == {
        "name": "corporate-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
        "optional": True,
    }


def test_the_identity_serves_only_caches_without_a_secret_and_inside_the_listed_sources() -> None:
    # Issue 12: a cache that names its own Secret uses only it, and credentials.sources narrows
    # what the cluster's identity may fetch, in PVC mode as on the nodes. Issue 21 item 2: and only
    # in the namespaces of credentials.namespaces, with sources matched by whole segments.
    config = HooksConfig.from_env(
        {
            "PRAESTO_DOWNLOADER_SERVICE_ACCOUNT": "praesto-downloader",
            "PRAESTO_DOWNLOADER_ENV": '{"PRAESTO_WORKLOAD_IDENTITY": "true", "AWS_ROLE_ARN": "arn:x"}',
            "PRAESTO_DOWNLOADER_POD_LABELS": '{"azure.workload.identity/use": "true"}',
            "PRAESTO_CREDENTIALS_NAMESPACES": "team-a",
            "PRAESTO_CREDENTIALS_SOURCES": "az://weights/shared, hf://my-org/",
        }
    )

    def template(uri: str, namespace: str = "team-a", **source: object) -> dict[str, Any]:
        spec = {"source": {"uri": uri, **source}, "storage": {"size": "1Gi", "storageClassName": "rwx"}}
        parent = modelcache("llm", spec=spec, namespace=namespace)
        job = download_job(parent, parse_spec(parent["spec"]), config)
        validate_child(job)
        return job["spec"]["template"]  # type: ignore[no-any-return]

    def entitled(uri: str, namespace: str = "team-a", **source: object) -> bool:
        made = template(uri, namespace, **source)
        env = {e["name"]: e.get("value") for e in made["spec"]["containers"][0]["env"]}
        account = made["spec"].get("serviceAccountName")
        labelled = "azure.workload.identity/use" in made["metadata"]["labels"]
        # the ServiceAccount, the identity env and the identity's Pod labels come together or not at all
        assert (env["PRAESTO_WORKLOAD_IDENTITY"] == "true") == (account == "praesto-downloader") == labelled
        assert "AWS_ROLE_ARN" not in env  # the cloud's own webhook injects it, never Praesto
        return account is not None

    assert entitled("az://weights/shared/llama")
    assert entitled("az://weights/shared")
    assert not entitled("az://weights/shared-private/llama")  # whole segments only
    assert not entitled("az://weights/private/llama")
    assert not entitled("az://weights/shared/llama", secretRef={"name": "own"})
    assert not entitled("az://weights/shared/llama", namespace="team-b")  # never opted in


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"PRAESTO_DOWNLOADER_ENV": "[1]"}, "JSON object of strings"),
        ({"PRAESTO_DOWNLOADER_POD_LABELS": "{"}, "is not JSON"),
        ({"PRAESTO_CA_BUNDLE_CONFIGMAP": "Bad Name"}, "<configmap>/<key>"),
    ],
)
def test_bad_settings_name_the_variable_and_the_fix(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        HooksConfig.from_env(env)
    assert next(iter(env)) in str(info.value) and needle in str(info.value)


def test_a_too_large_source_fails_the_job_at_once_and_says_so() -> None:
    job = _job(HooksConfig())
    rules = job["spec"]["podFailurePolicy"]["rules"]  # type: ignore[index]
    assert rules == [
        {"action": "FailJob", "onExitCodes": {"containerName": "download", "operator": "In", "values": [3]}}
    ]
    failed = {
        **job,
        "status": {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "PodFailurePolicy",
                    "message": "Container download for pod team-a/x failed with exit code 3 matching FailJob rule at index 0",
                }
            ]
        },
    }
    phase, reason, message = _job_state(failed)
    assert (phase, reason) == ("Failed", "SizeExceedsRequest") and "raise storage.size" in message


def test_local_mode_states_both_sizes_when_the_model_is_larger_than_requested() -> None:
    from datetime import UTC, datetime

    from praesto.hooks import rolling
    from praesto.hooks.local_status import aggregate
    from praesto.hooks.views import Copy, Parent

    parent = modelcache(
        "llm", spec={"source": {"uri": "s3://models/m"}, "storage": {"size": "1Gi"}}, namespace="a"
    )
    spec = parse_spec(parent["spec"])
    view = Parent.parse({"parent": parent})
    copies = [Copy.of({"spec": {"nodeName": "n1"}, "status": {"phase": "Ready", "sizeBytes": 3 << 30}})]
    rollout = rolling.plan(spec, view.before, ["n1"], copies)
    status = aggregate(view, spec, ["n1"], 0, copies, rollout, datetime(2026, 1, 1, tzinfo=UTC))
    (size,) = [c for c in status["conditions"] if c["type"] == "SizeWithinRequest"]
    assert size["status"] == "False" and size["reason"] == "SizeExceedsRequest"
    assert str(3 << 30) in size["message"] and str(1 << 30) in size["message"] and "1Gi" in size["message"]
    assert status["phase"] == "Ready"  # the copy is whole and usable


def test_a_job_without_the_identity_may_not_reach_the_metadata_address() -> None:
    """Issue 21 item 1: the chart's downloader.metadataEgress becomes a NetworkPolicy beside each Job
    that does not run as the identity, selecting exactly that Job's Pods."""
    config = HooksConfig.from_env(
        {
            "PRAESTO_DOWNLOADER_SERVICE_ACCOUNT": "praesto-downloader",
            "PRAESTO_CREDENTIALS_NAMESPACES": "team-a",
            "PRAESTO_CREDENTIALS_SOURCES": "s3://models/shared",
            "PRAESTO_DOWNLOADER_DENIED_EGRESS": "169.254.169.254/32,fd00:ec2::254/128",
        }
    )

    def children(uri: str, namespace: str = "team-a") -> dict[str, Any]:
        spec = {"source": {"uri": uri}, "storage": {"size": "1Gi", "storageClassName": "rwx"}}
        parent = modelcache("llm", spec=spec, namespace=namespace)
        made = pvc_pass(SyncRequest.parse({"parent": parent}), parse_spec(parent["spec"]), config, NOW)[
            "children"
        ]
        return {c["kind"]: c for c in made}

    anonymous = children("s3://models/private/llama")
    policy = anonymous["NetworkPolicy"]
    validate_child(policy)
    pod_labels = anonymous["Job"]["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items() and names.LABEL_MODEL_CACHE in selector
    assert policy["spec"]["policyTypes"] == ["Egress"]
    assert policy["spec"]["egress"] == [
        {
            "to": [
                {"namespaceSelector": {}},
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fd00:ec2::254/128"]}},
            ]
        }
    ]
    assert "NetworkPolicy" in children("s3://models/shared/llama", namespace="team-b")
    assert "NetworkPolicy" not in children("s3://models/shared/llama")  # the identity (GKE serves it there)
    with pytest.raises(ConfigError, match=r"PRAESTO_DOWNLOADER_DENIED_EGRESS.*must be a CIDR"):
        HooksConfig.from_env({"PRAESTO_DOWNLOADER_DENIED_EGRESS": "metadata.internal"})
