"""`praesto render`, HooksConfig.from_env and the CompositeController manifest."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from praesto.hooks.cli import main as praesto_main
from praesto.hooks.config import ConfigError, HooksConfig
from praesto.hooks.modelcache import HOOKS

from praesto import names
from testkit.hook_objects import SEED_LOCAL_SPEC, SEED_PVC_SPEC
from tests.hooks.schemas import ROOT, validate_child

SEEDS = f"""
apiVersion: {names.API_VERSION}
kind: ModelCache
metadata: {{name: tinyllama, namespace: default}}
spec: {SEED_LOCAL_SPEC}
---
apiVersion: {names.API_VERSION}
kind: ModelCache
metadata: {{name: tinyllama-rwx}}
spec: {SEED_PVC_SPEC}
"""
NODES = """
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: node-a, labels: {praesto.io/cache-node: "true"}}}
- {apiVersion: v1, kind: Node, metadata: {name: node-b}}
"""


def test_render_prints_children_and_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mc.yaml").write_text(SEEDS)
    (tmp_path / "nodes.yaml").write_text(NODES)
    code = praesto_main(
        [
            "render",
            "-f",
            str(tmp_path / "mc.yaml"),
            "--nodes",
            str(tmp_path / "nodes.yaml"),
            "--now",
            "2026-12-01T00:00:00Z",
        ]
    )
    assert code == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    # the PVC-mode Role and RoleBinding let the running Job's Pod write its live progress
    pvc_mode = ["PersistentVolumeClaim", "Job", "Role", "RoleBinding", "ModelCache"]
    assert kinds == ["ModelCacheNode", "ModelCache", *pvc_mode]
    assert docs[0]["spec"]["nodeName"] == "node-a"
    assert docs[1]["status"]["totalNodes"] == 1
    assert docs[6]["status"]["pvcName"] == names.pvc_name("tinyllama-rwx")
    for child in (docs[0], docs[2], docs[3]):
        validate_child(child)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("a: [", "not valid YAML"),
        ("kind: ConfigMap", "no object of kind ModelCache"),
        ("apiVersion: v9\nkind: ModelCache\nmetadata: {name: x}", "apiVersion"),
        (f"apiVersion: {names.API_VERSION}\nkind: ModelCache\nmetadata: {{}}", "metadata.name"),
    ],
)
def test_render_bad_files_say_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "mc.yaml"
    if content is not None:
        path.write_text(content)
    assert praesto_main(["render", "-f", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_render_invalid_spec_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mc.yaml"
    path.write_text(
        f"apiVersion: {names.API_VERSION}\nkind: ModelCache\nmetadata: {{name: x}}\nspec: {{source: {{uri: 'hf://a/b'}}}}"
    )
    assert praesto_main(["render", "-f", str(path)]) == 1
    assert "spec.storage.size: Required value" in capsys.readouterr().err


def test_config_from_env() -> None:
    config = HooksConfig.from_env(
        {
            "PRAESTO_DOWNLOADER_IMAGE": "r.example/p:1",
            "PRAESTO_DOWNLOADER_RESOURCES": '{"requests": {"cpu": "1"}}',
            "PRAESTO_JOB_BACKOFF_LIMIT": "2",
            "PRAESTO_JOB_ACTIVE_DEADLINE_SECONDS": "60",
            "PRAESTO_AGENT_SERVICE_ACCOUNT": "agent",
            "PRAESTO_NAMESPACE": "ops",
            "PRAESTO_HF_ENDPOINT": "https://mirror.example",
        }
    )
    assert config == HooksConfig(
        downloader_image="r.example/p:1",
        downloader_resources={"requests": {"cpu": "1"}},
        job_backoff_limit=2,
        job_active_deadline_seconds=60,
        agent_service_account="agent",
        namespace="ops",
        hf_endpoint="https://mirror.example",
    )
    assert HooksConfig.from_env({}).downloader_image.startswith("ghcr.io/praesto/praesto:")


def test_admission_settings_from_env() -> None:
    """The admission half of the hooks process's settings (#23 item 3): once, in HooksConfig."""
    config = HooksConfig.from_env(
        {
            "PRAESTO_IMAGE": "r.example/praesto:2",
            "PRAESTO_ADMISSION_LOOKUPS": "Off",
            "PRAESTO_LOOKUP_WATCH_TIMEOUT": "30",
            "PRAESTO_LOOKUP_MAX_STALENESS": "5",
            "PRAESTO_LOOKUP_COLD_WAIT": "0.3",
        }
    )
    assert (config.image, config.admission_lookups) == ("r.example/praesto:2", False)
    assert (config.lookup_watch_timeout, config.lookup_max_staleness, config.lookup_cold_wait) == (
        30,
        5.0,
        0.3,
    )
    default = HooksConfig.from_env({})
    assert default.admission_lookups is True and default.image == default.downloader_image
    assert (default.lookup_watch_timeout, default.lookup_max_staleness, default.lookup_cold_wait) == (
        300,
        60.0,
        2.0,
    )


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"PRAESTO_JOB_BACKOFF_LIMIT": "many"}, "PRAESTO_JOB_BACKOFF_LIMIT"),
        ({"PRAESTO_JOB_ACTIVE_DEADLINE_SECONDS": "0"}, "PRAESTO_JOB_ACTIVE_DEADLINE_SECONDS"),
        ({"PRAESTO_DOWNLOADER_RESOURCES": "{"}, "PRAESTO_DOWNLOADER_RESOURCES"),
        ({"PRAESTO_DOWNLOADER_RESOURCES": '{"cpu": 1}'}, "PRAESTO_DOWNLOADER_RESOURCES"),
        ({"PRAESTO_NAMESPACE": "Not A Namespace"}, "PRAESTO_NAMESPACE"),
        ({"PRAESTO_HF_ENDPOINT": "mirror"}, "PRAESTO_HF_ENDPOINT"),
        ({"PRAESTO_LOOKUP_WATCH_TIMEOUT": "0"}, "PRAESTO_LOOKUP_WATCH_TIMEOUT"),
        ({"PRAESTO_LOOKUP_MAX_STALENESS": "soon"}, "PRAESTO_LOOKUP_MAX_STALENESS"),
        ({"PRAESTO_LOOKUP_COLD_WAIT": "-1"}, "PRAESTO_LOOKUP_COLD_WAIT"),
    ],
)
def test_config_errors_name_the_variable(env: dict[str, str], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        HooksConfig.from_env(env)


def test_composite_controller_manifest() -> None:
    doc = yaml.safe_load((ROOT / "metacontroller" / "modelcache-controller.yaml").read_text())
    spec = doc["spec"]
    assert spec["generateSelector"] is True
    assert spec["parentResource"] == {
        "apiVersion": names.API_VERSION,
        "resource": names.MODELCACHE_PLURAL,
        "ignoreStatusChanges": True,
    }
    assert set(spec["hooks"]) == set(HOOKS)
    for hook, value in spec["hooks"].items():
        assert value["version"] == "v2"
        assert value["webhook"]["url"] == f"https://praesto-hooks.praesto-system.svc/hooks/modelcache/{hook}"
        assert set(value["webhook"]["caBundle"]) == {"inline"}
    strategies = {c["resource"]: c["updateStrategy"]["method"] for c in spec["childResources"]}
    assert strategies == {
        names.MODELCACHENODE_PLURAL: "InPlace",
        "persistentvolumeclaims": "OnDelete",
        "jobs": "OnDelete",
        "networkpolicies": "InPlace",
        "roles": "InPlace",
        "rolebindings": "Recreate",
    }
