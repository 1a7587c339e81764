"""The settings inventory (#23 item 3): who reads the environment, and whether the chart agrees.

(a) Only the settings modules (each process's edge: where flags and environment become one
settings object) read `os.environ`; nothing below them does (the proxies and the test-only crash
point once did, at the point of use). Each settings field has its docstring.
(b) Every variable the chart sets on the hooks Deployment, the node DaemonSet's containers and
the PVC-mode downloader Job is read by that process's settings, and every variable a settings
object reads is set by the chart or listed in `OPTIONAL` with why not; every flag the chart
passes is one the process's parser accepts. The names each settings object reads are recorded
by running it over a recording environment, not copied here.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from praesto.agent import cli as agent_cli
from praesto.agent.download.settings import DownloadSettings
from praesto.agent.settings import AgentSettings, add_run_arguments
from praesto.csi import cli as csi_cli
from praesto.csi.settings import CsiSettings
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc_job import download_job
from praesto.hooks.serving import server as hooks_server

from praesto.spec import parse_spec
from testkit.helm_chart import deep_merge, one, render_objects
from testkit.hook_objects import modelcache

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("praesto", "hooks", "agent", "csi")

# Each process's edge: flags and environment become its settings here, once, at start.
SETTINGS_MODULES = {
    "hooks/config.py": "HooksConfig.from_env: the hooks process (sync hooks and admission)",
    # main takes the environment once and hands it to the flags' defaults and to DownloadSettings
    # (`download`) or AgentSettings (`run`, agent/settings.py), which never read it themselves
    "agent/cli.py": "praesto-agent main: every subcommand's settings from flags and this environment",
    "csi/cli.py": "praesto-csi main: CsiSettings (csi/settings.py) from flags and this environment",
    "hooks/plan.py": "praesto plan main: DownloadSettings and the object stores' variables, as the download CLI",
    # writes, never reads: prometheus_client finds its multiprocess directory only through this variable
    "hooks/serving/worker_metrics.py": "praesto-hooks main: PROMETHEUS_MULTIPROC_DIR for its workers' metric files",
}
# The settings objects of the processes: a docstring for every field.
SETTINGS_TREES = {"agent/settings.py": ["MetricsSettings", "StartupTaintSettings", "ScrubSettings", "AgentSettings"],
                  "csi/settings.py": ["CsiSettings"]}  # fmt: skip
# Variables the chart sets for libraries and read from the environment the edge handed in (the proxies:
# download/proxies.py, read once into EngineSettings.proxies), not by name in a settings object: urllib/httpx/obstore honour the
# proxies, OpenSSL and requests the CA files, and the Job's HOME/HF_HOME keep huggingface_hub's
# caches in the writable /tmp.
LIBRARY_ENV = {
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "HOME", "HF_HOME",
}  # fmt: skip
# What argparse (terminal size) and gettext (locale) ask for while a parser is built.
PYTHON_ENV = {"COLUMNS", "LINES", "LANG", "LANGUAGE", "LC_ALL", "LC_MESSAGES"}
# Variables a settings object reads that the chart leaves unset, and why.
OPTIONAL = {
    "hooks": {
        "PRAESTO_ADMISSION_LOOKUPS": "local development only: no API access",
        "PRAESTO_LOOKUP_WATCH_TIMEOUT": "tuning; the default serves",
        "PRAESTO_LOOKUP_MAX_STALENESS": "tuning; the default serves",
        "PRAESTO_LOOKUP_COLD_WAIT": "tuning; the default serves",
        "PRAESTO_LAST_USED_GRANULARITY_SECONDS": "tuning; the default serves",
    },
}


# --- (a) who reads the environment ---------------------------------------------------------


def _reads_environment(tree: ast.AST) -> list[int]:
    """Lines that read the process environment: os.environ / os.getenv / os.environb, a bare
    `environ` imported from os, or urllib's proxy readers."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv", "getenvb"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "environb", "getenv") for a in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr in ("getproxies_environment", "getproxies"):
            lines.append(node.lineno)
    return lines


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "proto" not in path.relative_to(ROOT).parts:
                yield path


def test_only_settings_modules_read_the_environment() -> None:
    readers = {}
    for path in _sources():
        lines = _reads_environment(ast.parse(path.read_text(), str(path)))
        if lines:
            readers[str(path.relative_to(ROOT))] = lines
    unexpected = {k: v for k, v in readers.items() if k not in SETTINGS_MODULES}
    assert not unexpected, f"read the environment outside the settings modules (file: lines): {unexpected}"
    assert set(readers) == set(SETTINGS_MODULES), "a settings module that no longer reads it: update the list"


def _fields_without_docstring(tree: ast.Module, classes: list[str]) -> list[str]:
    """Fields (annotated class attributes) of `classes` not followed by their docstring."""
    found = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    missing = []
    for name in classes:
        body = found[name].body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                after = body[i + 1] if i + 1 < len(body) else None
                if not (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                        and isinstance(after.value.value, str)):  # fmt: skip
                    missing.append(f"{name}.{node.target.id}")
    return missing


@pytest.mark.parametrize("module", sorted(SETTINGS_TREES))
def test_every_settings_field_has_its_docstring(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    assert not _fields_without_docstring(tree, SETTINGS_TREES[module]), f"{module}: document these fields"


def test_the_docstring_check_sees_a_bare_field() -> None:
    code = 'class S:\n    a: int = 1\n    """A."""\n    b: int = 2\n    c: str = ""\n    """C."""\n'
    assert _fields_without_docstring(ast.parse(code), ["S"]) == ["S.b"]


def test_the_scan_sees_every_way_of_reading() -> None:
    code = (
        "import os\nfrom os import environ\nimport urllib.request\n"
        "a = os.environ.get('A')\nb = os.getenv('B')\nc = urllib.request.getproxies_environment()\n"
        "d = request.environ.get('gunicorn.socket')\n"
    )
    assert sorted(_reads_environment(ast.parse(code))) == [2, 4, 5, 6]  # not request.environ


# --- (b) the chart against the settings ----------------------------------------------------


class Recording(dict[str, str]):
    """An environment that remembers every name asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return super().__contains__(key)


def _recorded(monkeypatch: pytest.MonkeyPatch, *builders: Callable[[Recording], object]) -> set[str]:
    env = Recording()
    with monkeypatch.context() as patch:
        patch.setattr("os.environ", env)
        for build in builders:
            build(env)
    return env.asked - PYTHON_ENV


def hooks_inventory(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    return _recorded(monkeypatch, HooksConfig.from_env)


def agent_settings(env: Any, argv: tuple[str, ...] = ("run", "--node-name=n")) -> AgentSettings:
    """`praesto-agent run`'s settings as its edge builds them (cli.main): flags over `env`."""
    return AgentSettings.from_args(agent_cli.build_parser(True, env).parse_args(argv), env)


def csi_settings(env: Any, argv: tuple[str, ...] = ("--node-name=n",)) -> CsiSettings:
    """`praesto-csi`'s settings as its edge builds them (cli.main): flags over `env`."""
    return CsiSettings.from_args(csi_cli.build_parser(env).parse_args(argv))


def agent_inventory(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    return _recorded(monkeypatch, agent_settings) | AGENT_AT_USE


def downloader_inventory(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    return (
        _recorded(monkeypatch, lambda env: agent_cli.build_parser(False, env), DownloadSettings.from_env)
        | DOWNLOADER_AT_USE
    )


def csi_inventory(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    return _recorded(monkeypatch, csi_settings)


# Names read below the settings objects, from the environment the edge handed in (not os.environ).
# Read from EngineSettings.store_environment (filtered from the environment each process takes at its edge) by
# origins/objstore/creds.py store_config, with the store clients' own variables.
DOWNLOAD_AT_USE = {
    "PRAESTO_WORKLOAD_IDENTITY",
    "PRAESTO_OCI_MIRRORS",
}  # and origins/oci/registry.py mirrors_of
AGENT_AT_USE = DOWNLOAD_AT_USE
DOWNLOADER_AT_USE = DOWNLOAD_AT_USE

# Everything switched on, so every conditional variable and flag is rendered.
FULL_VALUES: dict[str, Any] = {
    "downloader": {
        "hfEndpoint": "https://hf-mirror.example.com",
        "modelscopeEndpoint": "https://modelscope-mirror.example.com",
        "allowedImages": ["registry.example.com/praesto/*"],
        "metadataEgress": {"deny": True},
    },
    "credentials": {
        "namespaces": ["team-a"],
        "sources": ["s3://models/"],
        "identity": {"serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}},
    },
    "downloads": {
        "caBundle": {"configMapName": "corporate-ca"},
        "proxy": {"httpProxy": "http://proxy:3128", "httpsProxy": "http://proxy:3128", "noProxy": ".svc"},
        "oci": {"mirrors": {"docker.io": ["https://mirror.example.com"]}},
        "egress": {"allowedCIDRs": ["10.20.0.0/16", "fd00:20::/64"]},
    },
    "verification": {
        "trust": {"platform": {"publicKey": "-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----\n"}},
        "requiredIn": ["team-a"],
    },
    "nodeAgent": {"peers": {"enabled": True}, "reserve": "10Gi"},
    "originBudget": {"enabled": True},
    "webhooks": {"clientAuth": {"caBundle": "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"}},
}


# credentials.identity and .secretRef exclude each other: the second render has the Secret.
SECRET_VALUES = deep_merge(
    {k: v for k, v in FULL_VALUES.items() if k != "credentials"},
    {"credentials": {"namespaces": ["team-a"], "secretRef": {"name": "cloud-creds"}}},
)


@pytest.fixture(scope="module")
def renders() -> list[list[dict[str, Any]]]:
    return [render_objects(FULL_VALUES), render_objects(SECRET_VALUES)]


def _containers(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    spec = one(objects, kind, name)["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


def _each(renders: list[list[dict[str, Any]]], kind: str, name: str | None, container: str) -> list[Any]:
    return [_containers(objects, kind, name)[container] for objects in renders]


def _env_names(*containers: dict[str, Any]) -> set[str]:
    return {e["name"] for c in containers for e in c.get("env") or []}


def _plain_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def _check(process: str, chart_sets: set[str], reads: set[str], optional: dict[str, str]) -> None:
    unread = sorted(chart_sets - reads - LIBRARY_ENV)
    assert not unread, f"{process}: the chart sets variables no settings object reads: {unread}"
    unset = sorted(reads - chart_sets - set(optional))
    assert not unset, (
        f"{process}: settings read variables the chart never sets (set them or add to OPTIONAL): {unset}"
    )
    stale = sorted(set(optional) - reads)
    assert not stale, f"{process}: OPTIONAL names variables nothing reads: {stale}"


def test_hooks_deployment_env_is_the_hooks_settings(
    renders: list[list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    containers = _each(renders, "Deployment", "praesto-hooks", "hooks")
    _check("hooks", _env_names(*containers), hooks_inventory(monkeypatch), OPTIONAL["hooks"])
    for hooks, objects in zip(containers, renders, strict=True):
        assert hooks["command"] == ["praesto-hooks"]
        hooks_server.parse_args(hooks["args"])  # every flag the chart passes is one praesto-hooks takes
        mounted = _mount_trust(objects, tmp_path)
        HooksConfig.from_env(_mounted(_plain_env(hooks), mounted))  # and every value it sets is accepted


def test_node_daemonset_env_is_the_agent_and_csi_settings(
    renders: list[list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    agents, csis = _each(renders, "DaemonSet", None, "agent"), _each(renders, "DaemonSet", None, "csi")
    reads = agent_inventory(monkeypatch)
    _check("node agent", _env_names(*agents), reads, {
        "KUBECONFIG": "outside a cluster only; in-cluster config otherwise",
        "PRAESTO_CREDENTIALS_DIR": "the `download` subcommand's (the PVC-mode Job sets it)",
        "PRAESTO_PROGRESS_JOB": "the `download` subcommand's (the PVC-mode Job sets it)",
        **dict.fromkeys(_flag_env_names(reads), "the chart passes the flag instead"),
    })  # fmt: skip
    _check(
        "csi", _env_names(*csis), csi_inventory(monkeypatch), {"CSI_ENDPOINT": "the chart passes --endpoint"}
    )
    for agent, csi, objects in zip(agents, csis, renders, strict=True):
        # every flag the chart passes is one the process takes, and with every value the chart
        # sets (the downward API's filled in, the ConfigMaps mounted) the settings are built without a refusal
        assert agent["command"] == ["praesto-agent"] and agent["args"][0] == "run"
        mounted = _mount_trust(objects, tmp_path)
        args = [a.replace(TRUST_DIR, str(mounted)) for a in _expand(agent["args"])]
        agent_settings(_plain_env(agent), tuple(args))
        assert csi["command"] == ["praesto-csi"]
        csi_settings(_plain_env(csi), tuple(_expand(csi["args"])))


TRUST_DIR = "/etc/praesto/cluster-trust"  # where the chart mounts verification.trust's ConfigMap


def _mount_trust(objects: list[dict[str, Any]], tmp_path: Path) -> Path:
    """What the kubelet mounts at TRUST_DIR: the rendered trust ConfigMap's keys as files."""
    mounted = tmp_path / "cluster-trust"
    mounted.mkdir(exist_ok=True)
    for config_map in (
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-trust")
    ):
        for key, value in config_map["data"].items():
            (mounted / key).write_text(value)
    return mounted


def _mounted(env: dict[str, str], mounted: Path) -> dict[str, str]:
    return {k: v.replace(TRUST_DIR, str(mounted)) for k, v in env.items()}


DOWNWARD_API = {"NODE_NAME": "worker-1", "POD_IP": "10.0.0.7", "POD_NAME": "agent-x", "POD_UID": "u-1"}


def _expand(args: list[str]) -> list[str]:
    """What the kubelet does with $(VAR) references to the downward API's variables."""
    return [re.sub(r"\$\((\w+)\)", lambda m: DOWNWARD_API[m.group(1)], a) for a in args]


def _flag_env_names(names: set[str]) -> set[str]:
    """Agent variables that only default a flag the chart passes explicitly (PRAESTO_* of a flag)."""
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, {})
    flags = {a.dest.upper() for a in parser._actions}
    return {n for n in names if n.removeprefix("PRAESTO_") in flags}


def test_downloader_job_env_is_the_downloader_settings(
    renders: list[list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reads = downloader_inventory(monkeypatch)
    sources = ({"uri": "hf://org/model", "secretRef": {"name": "hf"}}, {"uri": "s3://models/llm"})
    mounted = _mount_trust(renders[0], tmp_path)
    for hooks, source in itertools.product(_each(renders, "Deployment", "praesto-hooks", "hooks"), sources):
        config = HooksConfig.from_env(_mounted(_plain_env(hooks), mounted))
        spec = {"source": source, "storage": {"size": "1Gi", "storageClassName": "rwx"}}
        parent = modelcache("llm", namespace="team-a", spec=spec)
        job = download_job(parent, parse_spec(parent["spec"]), config)
        (container,) = job["spec"]["template"]["spec"]["containers"]
        unread = sorted(_env_names(container) - reads - LIBRARY_ENV)
        assert not unread, (
            f"downloader Job: the sync hook sets variables the downloader never reads: {unread}"
        )
        agent_cli.build_parser(False, {}).parse_args(container["args"])
