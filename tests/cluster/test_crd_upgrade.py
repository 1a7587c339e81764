"""The CRD upgrade procedure of the chart README ("Upgrading the CRDs"), run as printed, on the real API server.

Helm installs `crds/` on the first install only (v4.3.2 `pkg/action/install.go`: `installCRDs`,
server-side apply as field manager `helm`) and leaves them alone on upgrade
(`pkg/action/upgrade.go` renders without them). An older chart is made here from the current CRDs
by removing one field (ModelCache `spec.updateStrategy`, mutable after create, so an existing cache
can take it up) and its last printer column (new columns come with upgrades too). The real `helm` CLI installs a chart holding those older CRDs (only them: the rest
of the chart plays no part in Helm's CRD handling, and the whole chart's tier is
tests/node's), a cache is created under them, `helm upgrade` to the current CRDs leaves the CRD as
it was, then the README's command runs. There is no kubectl here (tests/tools builds helm,
promtool and actionlint), so the command is read from the README and sent as kubectl v0.37.2
sends it (`pkg/cmd/apply/apply.go` `applyOneObject`: per object a PATCH of type
application/apply-patch+yaml, field manager `kubectl`, `force` from `--force-conflicts`,
`fieldValidation=Strict`, the `-f` directory's .yaml/.yml/.json files in name order).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.controlplane import ControlPlaneUnavailable
from testkit.helm_chart import CHART_DIR, CRD_DIR, ROOT
from testkit.kube_real import RealKube
from testkit.tools import tool

Obj = dict[str, Any]
README = CHART_DIR / "README.md"
SECTION = "## Upgrading the CRDs"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MODELCACHE_CRD = f"modelcaches.{names.GROUP}"
NEW_FIELD = "updateStrategy"  # of ModelCache spec: absent from the "older" CRD
NS = "crd-upgrade"
RELEASE = "praesto"
HELM_DEADLINE = 120


def documented_command() -> list[str]:
    """The one `kubectl` line in the README's CRD section's code block."""
    section = README.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"{README}: no bash block under {SECTION!r}"
    lines = [line for line in block.group(1).splitlines() if line.startswith("kubectl ")]
    assert len(lines) == 1, f"{README}: expected one kubectl line under {SECTION!r}, found {lines}"
    return shlex.split(lines[0], comments=True)


def kubectl_apply(kube: RealKube, argv: list[str]) -> list[Obj]:
    """What `kubectl apply --server-side [--force-conflicts] -f DIR` sends; refuses any other form."""
    words = argv[2:]
    assert argv[:2] == ["kubectl", "apply"] and "-f" in words, f"not `kubectl apply -f`: {argv}"
    directory = ROOT / words[words.index("-f") + 1]
    flags = set(words) - {"-f", words[words.index("-f") + 1]}
    assert flags <= {"--server-side", "--force-conflicts"}, f"this test does not know {flags} ({argv})"
    assert "--server-side" in flags, "only a server-side apply is implemented here"
    force = "true" if "--force-conflicts" in flags else "false"
    query = {"fieldManager": "kubectl", "fieldValidation": "Strict", "force": force}
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
    applied = []
    for file in files:
        for doc in yaml.safe_load_all(file.read_text()):
            if doc:
                url = f"{CRDS}/{doc['metadata']['name']}"
                ct = "application/apply-patch+yaml"  # the client sends it as JSON, which is YAML
                applied.append(kube.call("PATCH", url, doc, query=query, content_type=ct))
    return applied


def older_crds(target: Path) -> Path:
    """crds/ of the current chart, with ModelCache's spec.updateStrategy and last printer column taken out."""
    target.mkdir(parents=True)
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["metadata"]["name"] == MODELCACHE_CRD:
            for version in crd["spec"]["versions"]:
                del version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][NEW_FIELD]
                version["additionalPrinterColumns"] = version["additionalPrinterColumns"][:-1]
        (target / path.name).write_text(yaml.safe_dump(crd, sort_keys=False))
    return target


def crds_chart(directory: Path, crds: Path, version: str) -> Path:
    """A chart holding only `crds` (Helm reads crds/ from the chart like any other)."""
    directory.mkdir(parents=True)
    (directory / "Chart.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v2", "name": "praesto", "version": version, "type": "application"})
    )
    (directory / "crds").symlink_to(crds.resolve(), target_is_directory=True)
    return directory


def helm(home: Path, kubeconfig: Path, *args: str) -> str:
    try:
        binary = tool("helm")
    except ControlPlaneUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"the CRD upgrade runs the real helm in CI: {err}")
        pytest.skip(str(err))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),  # never the developer's helm config or cache
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(kubeconfig),
    }
    done = subprocess.run(
        [str(binary), *args], env=env, capture_output=True, text=True, timeout=HELM_DEADLINE, check=False
    )
    assert done.returncode == 0, f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stderr}"
    return done.stdout


def served_version(kube: RealKube) -> Obj:
    version: Obj = kube.call("GET", f"{CRDS}/{MODELCACHE_CRD}")["spec"]["versions"][0]
    return version


def spec_fields(kube: RealKube) -> set[str]:
    return set(served_version(kube)["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])


def strict_patch(kube: RealKube, name: str, patch: Obj) -> Obj:
    """A merge patch that fails on any field the served schema does not know (as kubectl's default does)."""
    path = kube.path(f"modelcaches.{names.GROUP}", NS, name)
    query = {"fieldValidation": "Strict"}
    patched: Obj = kube.call("PATCH", path, patch, query=query, content_type="application/merge-patch+json")
    return patched


def restore_current_crds(kube: RealKube) -> None:
    """Leave the session's server with the chart's CRDs as every other test expects them."""
    kubectl_apply(kube, ["kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR)])
    kube.wait_until(lambda: NEW_FIELD in spec_fields(kube), 30, "the current ModelCache CRD to be served")


def test_the_documented_crd_upgrade_keeps_caches_and_serves_new_fields(
    kube: RealKube, tmp_path: Path
) -> None:
    argv = documented_command()
    kubeconfig = kube.plane.admin_kubeconfig
    home = tmp_path / "home"
    old_chart = crds_chart(tmp_path / "old", older_crds(tmp_path / "old-crds"), "0.6.0")
    new_chart = crds_chart(tmp_path / "new", CRD_DIR, "0.7.0")
    strategy = {"spec": {NEW_FIELD: {"maxFetching": 2}}}
    try:
        # As on a cluster where the older chart was installed first: the CRD exists only as Helm made it.
        kube.call("DELETE", f"{CRDS}/{MODELCACHE_CRD}")
        kube.wait_until(lambda: _absent(kube, f"{CRDS}/{MODELCACHE_CRD}"), 60, "the ModelCache CRD to go")
        helm(home, kubeconfig, "install", RELEASE, str(old_chart), "--namespace", NS, "--create-namespace")
        assert NEW_FIELD not in spec_fields(kube)
        cache = kube.create(_modelcache("before-upgrade"))
        with pytest.raises(ApiException) as refused:
            strict_patch(kube, "before-upgrade", strategy)
        assert refused.value.status == 422 and f'unknown field "spec.{NEW_FIELD}"' in _message(refused.value)

        # The premise: `helm upgrade` does not touch crds/.
        helm(home, kubeconfig, "upgrade", RELEASE, str(new_chart), "--namespace", NS)
        assert NEW_FIELD not in spec_fields(kube)

        # Why the README says --force-conflicts: `spec.versions` is an atomic list (apiextensions v1
        # types.go, +listType=atomic) that Helm's apply owns, so any schema change is a conflict.
        without_force = [word for word in argv if word != "--force-conflicts"]
        with pytest.raises(ApiException) as conflict:
            kubectl_apply(kube, without_force)
        assert conflict.value.status == 409 and 'conflict with "helm"' in _message(conflict.value)

        applied = kubectl_apply(kube, argv)  # the documented procedure, exactly as printed
        assert {crd["metadata"]["name"] for crd in applied} == {
            yaml.safe_load(p.read_text())["metadata"]["name"] for p in CRD_DIR.glob("*.yaml")
        }
        kube.wait_until(lambda: NEW_FIELD in spec_fields(kube), 30, "the new ModelCache schema to be served")
        current = yaml.safe_load((CRD_DIR / f"{MODELCACHE_CRD}.yaml").read_text())["spec"]["versions"][0]
        assert served_version(kube)["additionalPrinterColumns"] == current["additionalPrinterColumns"]

        kept = kube.get(f"modelcaches.{names.GROUP}", "before-upgrade", NS)
        assert kept is not None and kept["metadata"]["uid"] == cache["metadata"]["uid"]
        assert kept["spec"] == cache["spec"]
        # Validation of the served schema catches up with the CRD a moment later: poll.
        kube.wait_until(
            lambda: _accepted(kube, "before-upgrade", strategy), 30, "spec.updateStrategy accepted"
        )
        updated = strict_patch(kube, "before-upgrade", strategy)
        assert updated["metadata"]["uid"] == cache["metadata"]["uid"]
        assert updated["spec"][NEW_FIELD] == {"maxFetching": 2}
        created = kube.create(_modelcache("after-upgrade", **strategy["spec"]))
        assert created["spec"][NEW_FIELD] == {"maxFetching": 2}
    finally:
        restore_current_crds(kube)


def _modelcache(name: str, **spec: Any) -> Obj:
    body: Obj = {"source": {"huggingface": {"repo": "org/tiny"}}, "storage": {"size": "1Gi"}}
    body.update(copy.deepcopy(spec))
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHE_KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": body,
    }


def _absent(kube: RealKube, path: str) -> bool:
    try:
        kube.call("GET", path)
    except ApiException as err:
        return bool(err.status == 404)
    return False


def _accepted(kube: RealKube, name: str, patch: Obj) -> bool:
    try:
        strict_patch(kube, name, patch)
    except ApiException as err:
        if err.status == 422:
            return False
        raise
    return True


def _message(err: ApiException) -> str:
    return str(json.loads(err.body)["message"])
