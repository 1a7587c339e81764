"""Issue 21 item 18: whatever a ModelCache asks of the downloader's securityContext, its Pod stays restricted.

The Pod Security admission controller of the real kube-apiserver, enforcing the
"restricted" profile on a namespace, judges the Pod of each download Job the sync
hook renders: for every override the spec parser accepts, and for the ones it
refuses (the Job builder checks again, so even an override that got past the
parser is not merged). Before, `allowPrivilegeEscalation: null` and an empty
`capabilities.drop` were accepted and merged, and the API server refused the Pod.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc_job import download_job

from praesto.spec import InvalidSpec, parse_spec
from testkit.chart_install import ensure_namespace
from tests.cluster.installed import Installed

RESTRICTED = "restricted-downloads"
BASE = {"source": {"uri": "s3://models/llama"}, "storage": {"size": "1Gi", "storageClassName": "rwx"}}
ACCEPTED = [
    {"runAsUser": 1000, "runAsGroup": 1000},
    {"readOnlyRootFilesystem": False},
    {"capabilities": {"drop": ["ALL", "NET_RAW"]}},
    {"seccompProfile": {"type": "RuntimeDefault"}, "allowPrivilegeEscalation": False},
]
REFUSED = [
    {"allowPrivilegeEscalation": None},
    {"capabilities": {"drop": []}},
    {"capabilities": None},
    {"runAsNonRoot": None},
    {"seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/anything.json"}},
    {"seccompProfile": {"type": "Unconfined"}},
    {"privileged": True},
    {"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}},
]


@pytest.fixture(scope="module")
def namespace(installed: Installed) -> str:
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    ensure_namespace(installed.admin, RESTRICTED, labels)
    return RESTRICTED


def job_pod(override: dict[str, Any], *, parsed: bool) -> dict[str, Any]:
    """The Pod the Job controller would create from the Job the sync hook renders for this override."""
    spec_body = {**BASE, "downloader": {"containerSecurityContext": override}}
    if parsed:
        spec = parse_spec(spec_body)
    else:  # past the parser: the Job builder's own check must still hold
        spec = replace(parse_spec(BASE), downloader={"containerSecurityContext": override})
    parent = {"metadata": {"name": "restricted", "namespace": RESTRICTED, "uid": "0"}, "spec": spec_body}
    template = download_job(parent, spec, HooksConfig())["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "download", "namespace": RESTRICTED, "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }


def admitted(installed: Installed, pod: dict[str, Any]) -> None:
    client.CoreV1Api(installed.admin.api).create_namespaced_pod(RESTRICTED, pod, dry_run="All")


@pytest.mark.parametrize("override", ACCEPTED, ids=str)
def test_an_accepted_override_keeps_the_pod_restricted(
    installed: Installed, namespace: str, override: dict[str, Any]
) -> None:
    admitted(installed, job_pod(override, parsed=True))


@pytest.mark.parametrize("override", REFUSED, ids=str)
def test_a_refused_override_never_reaches_the_pod(
    installed: Installed, namespace: str, override: dict[str, Any]
) -> None:
    with pytest.raises(InvalidSpec):
        parse_spec({**BASE, "downloader": {"containerSecurityContext": override}})
    admitted(installed, job_pod(override, parsed=False))
