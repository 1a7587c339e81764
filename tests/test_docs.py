"""The user guide's commands and manifests work as written.

Every ```yaml block is checked the way the cluster would check it (ModelCaches
against our CRD schema and spec parser, Pods' annotations by the admission
parser); every ```bash line is checked against what it names: chart keys in
`--set` exist in values.schema.json, kubectl resources are our CRDs' names or
short names, labels are the ones the code reads, node copy names are the ones
the controller makes, paths exist in the repository.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import pytest
import yaml
from praesto.agent.cli import build_parser
from praesto.hooks.admission.annotations import parse_annotations
from praesto.hooks.admission.validate import immutable_changes
from praesto.hooks.plan import parse_args as plan_args

from praesto import names
from praesto.spec import parse_spec
from testkit.helm_chart import CHART_DIR, ROOT, value_key_exists
from tests.hooks.schemas import crd_errors

GUIDE = ROOT / "docs" / "user-guide.md"
OUR_RESOURCES = {"modelcache", "modelcaches", "mc", "modelcachenode", "modelcachenodes", "mcn"}
CORE_RESOURCES = {"pod", "pods", "namespace", "node", "secret", "deployment"}


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(), re.S)


def commands() -> list[list[str]]:
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():  # a continued line is one command
            line = line.split(" #", 1)[0].strip()
            if line:
                out.append(shlex.split(line))
    return out


def test_the_guide_has_what_the_issue_asks_for() -> None:
    text = GUIDE.read_text()
    for heading in ("Quickstart", "storage modes", "Private models", "Eviction", "Troubleshooting"):
        assert heading in text
    assert len(blocks("yaml")) >= 4 and len(commands()) >= 8


@pytest.mark.parametrize("doc", [yaml.safe_load(b) for b in blocks("yaml")], ids=lambda d: d["kind"])
def test_manifests_are_accepted(doc: dict[str, Any]) -> None:
    if doc["kind"] == names.MODELCACHE_KIND:
        assert crd_errors(doc) == []
        parse_spec(doc["spec"])  # raises InvalidSpec naming the field
    elif doc["kind"] == "Pod":
        wanted = parse_annotations(doc["metadata"]["annotations"])
        assert wanted.mounts
    elif doc["kind"] == "AdmissionConfiguration":  # the shape the real tier's API server runs with
        assert {p["name"] for p in doc["plugins"]} == {
            "ValidatingAdmissionWebhook",
            "MutatingAdmissionWebhook",
        }
        for plugin in doc["plugins"]:
            assert plugin["configuration"]["kind"] == "WebhookAdmissionConfiguration"
            assert plugin["configuration"]["kubeConfigFile"]
    elif doc["kind"] == "Config":  # the webhook client kubeconfig that file names
        for user in doc["users"]:
            assert {"client-certificate", "client-key"} <= set(user["user"])
    else:
        pytest.fail(f"unexpected manifest kind {doc['kind']}")


def _check_helm(argv: list[str]) -> None:
    if argv[1] == "dependency":
        assert (ROOT / argv[3]).resolve() == CHART_DIR
        return
    assert argv[1] in ("install", "upgrade")
    assert (ROOT / argv[3]).resolve() == CHART_DIR
    for i, arg in enumerate(argv):
        if arg in ("--set", "--set-string"):
            key = argv[i + 1].split("=", 1)[0]
            assert value_key_exists(key), f"{arg} {key}: not a chart value"


def _check_kubectl(argv: list[str]) -> None:
    verb, rest = argv[1], argv[2:]
    if verb == "label":
        kind, _name, label = rest[0], rest[1], rest[2]
        known = {
            "namespace": f"{names.LABEL_INJECTION}={names.INJECTION_ENABLED}",
            "node": f"{names.LABEL_CACHE_NODE}=true",
        }
        assert label == known[kind]
    elif verb in ("get", "delete", "describe"):
        assert rest[0] in OUR_RESOURCES
        if rest[0] == "modelcachenode" and verb == "delete":
            assert rest[1] == names.modelcachenode_name("tinyllama", "gpu-node-1")
    elif verb == "patch":  # only what a rolling update may change (hooks/admission/validate.py)
        assert rest[0] == "modelcache" and rest[rest.index("--type") + 1] == "merge"
        new = json.loads(rest[rest.index("-p") + 1])
        source = new["spec"]["source"]
        if "uri" in source:  # an object store's prefix: the bucket stays
            old_source: dict[str, Any] = {"uri": source["uri"].rsplit("/", 1)[0] + "/v1"}
            patched_source: dict[str, Any] = source
        else:
            old_source = {"huggingface": {"repo": "org/model", "revision": "main"}}
            patched_source = {"huggingface": {**old_source["huggingface"], **source["huggingface"]}}
        old: dict[str, Any] = {"source": old_source, "storage": {"size": "5Gi"}}
        patched = {**old, **new["spec"], "source": patched_source}
        assert immutable_changes(old, patched) == [], "the guide patches an immutable field"
    elif verb == "apply":
        assert rest[0] == "-f"
    elif verb == "create" and rest[:2] == ["secret", "docker-registry"]:  # its type's key: .dockerconfigjson
        assert (
            any(a.startswith("--docker-server=") for a in rest)
            and names.DOCKER_CONFIG_KEY == ".dockerconfigjson"
        )
    elif verb == "create":
        assert rest[:2] == ["secret", "generic"] and any(
            a.startswith(("--from-literal=HF_TOKEN=", "--from-file=key.pub=")) for a in rest
        )
    else:
        pytest.fail(f"kubectl {verb}: not checked by this test; add a rule")


@pytest.mark.parametrize("argv", commands(), ids=lambda a: " ".join(a[:3]))
def test_commands_name_things_that_exist(argv: list[str]) -> None:
    tool = argv[0]
    if tool == "sudo":
        assert names.DEFAULT_BASE_PATH in argv
    elif tool == "helm":
        _check_helm(argv)
    elif tool == "kubectl":
        _check_kubectl(argv)
    elif tool == "praesto-agent":  # parsed by praesto-agent's own parser: every flag exists
        build_parser(False, {}).parse_args(argv[1:])
    elif tool == "praesto":  # `praesto plan`, parsed by its own parser (run as printed: test_cli_plan.py)
        assert argv[1] == "plan"
        plan_args(argv[2:])
    elif (
        tool == "model_signing"
    ):  # the OpenSSF model-signing CLI (model-signing 1.1.1, src/model_signing/_cli.py)
        assert argv[1] in ("sign", "verify") and argv[2] in ("key", "certificate", "sigstore")
        assert "--signature" not in argv or argv[argv.index("--signature") + 1].endswith(
            names.DEFAULT_SIGNATURE_FILE
        )
    else:
        pytest.fail(f"{tool}: not checked by this test; add a rule")


def test_troubleshooting_lists_the_reasons_the_code_gives() -> None:
    table = GUIDE.read_text().split("## Troubleshooting", 1)[1]
    for reason in ("NoNodesMatch", "Waiting", "WaitingForSecret", "InsufficientDiskSpace", "NodeFailed",
                   "ChecksumMismatch", "SizeExceedsRequest", "BasePathMissing", "Evicted", "InvalidSpec"):  # fmt: skip
        assert f"`{reason}`" in table
        sources = [*(ROOT / "agent").rglob("*.py"), *(ROOT / "hooks").rglob("*.py")]
        assert any(f'"{reason}"' in p.read_text() for p in sources), (
            f"{reason} is not a reason the code gives"
        )
