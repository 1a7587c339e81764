"""The CRD upgrade procedure of the chart README ("Upgrading the CRDs"), run as printed, on the real API server.

Helm installs `crds/` on the first install only (v4.3.2 `pkg/action/install.go`: `installCRDs`,
server-side apply as field manager `helm`) and leaves them alone on upgrade
(`pkg/action/upgrade.go` renders without them). An older chart is made here from the current CRDs
by removing one field (ModelCache `spec.updateStrategy`, mutable after create, so an existing cache
can take it up) and its last printer column (new columns come with upgrades too). The real `helm`
CLI installs a chart holding those older CRDs (only them: the rest of the chart plays no part in
Helm's CRD handling, and the whole chart's tier is tests/node's), a cache is created under them,
`helm upgrade` to the current CRDs leaves the CRD as it was, then the README's `kubectl` lines run
as printed: `bash -c '<line>'` in the repository root (where the printed relative path resolves;
nothing is written there), the tiers' kubectl (k8s.io/kubectl v0.37.2, built from tests/tools)
first on PATH, KUBECONFIG the admin's. The section's `helm upgrade` line needs the whole chart and
is run as printed by tests/cluster/test_documented_helm_lines.py.
"""

from __future__ import annotations

import copy
import json
import os
import re
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
NOTES = CHART_DIR / "templates" / "NOTES.txt"
SECTION = "## Upgrading the CRDs"
FORCE = "--force-conflicts"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MODELCACHE_CRD = f"modelcaches.{names.GROUP}"
NEW_FIELD = "updateStrategy"  # of ModelCache spec: absent from the "older" CRD
NS = "crd-upgrade"
RELEASE = "praesto"
DEADLINE = 120  # seconds, for each helm or kubectl run


def documented_lines() -> list[str]:
    """The `kubectl` lines of the README's CRD section's code block, as printed, in order."""
    section = README.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"{README}: no bash block under {SECTION!r}"
    lines = [line.strip() for line in block.group(1).splitlines() if line.strip().startswith("kubectl ")]
    assert lines, f"{README}: no kubectl line under {SECTION!r}"
    return lines


def notes_crd_lines() -> list[str]:
    """The CRD command NOTES.txt prints after every install and upgrade (template-free lines)."""
    return [line.strip() for line in NOTES.read_text().splitlines() if "crds" in line and "kubectl" in line]


def tool_env(home: Path, kubeconfig: Path) -> dict[str, str]:
    """The built helm and kubectl first on PATH, never the developer's config, the tier's admin."""
    try:
        kubectl, helm = tool("kubectl"), tool("helm")
    except ControlPlaneUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"the CRD upgrade runs the real helm and kubectl in CI: {err}")
        pytest.skip(str(err))
    assert kubectl.parent == helm.parent, "helm and kubectl come from one tools build (tests/tools)"
    return {
        "PATH": f"{kubectl.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home),  # kubectl's discovery cache and helm's config land here
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(kubeconfig),
    }


def run(env: dict[str, str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    """In the repository root, read only: the printed relative paths resolve there."""
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE, check=False
    )


def printed(env: dict[str, str], line: str) -> subprocess.CompletedProcess[str]:
    """`bash -c` the line exactly as printed."""
    return run(env, ["bash", "-c", line])


def helm(env: dict[str, str], *args: str) -> str:
    done = run(env, [str(tool("helm")), *args])
    assert done.returncode == 0, f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stderr}"
    return done.stdout


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


def managers(kube: RealKube, name: str) -> set[tuple[str, str]]:
    """(manager, operation) of each managedFields entry of a CRD."""
    crd = kube.call("GET", f"{CRDS}/{name}")
    return {(entry["manager"], entry["operation"]) for entry in crd["metadata"].get("managedFields", [])}


def restore_current_crds(kube: RealKube, env: dict[str, str]) -> None:
    """Leave the session's server with the chart's CRDs as every other test expects them
    (the built kubectl with explicit words, so a broken README line cannot break the cleanup)."""
    done = run(env, [str(tool("kubectl")), "apply", "--server-side", FORCE, "-f", str(CRD_DIR)])
    assert done.returncode == 0, f"restoring the CRDs failed:\n{done.stderr}"
    kube.wait_until(lambda: NEW_FIELD in spec_fields(kube), 30, "the current ModelCache CRD to be served")


def test_the_notes_print_the_readme_crd_command() -> None:
    """NOTES.txt repeats the procedure after each install and upgrade: the same line, so the test
    below runs it too."""
    assert notes_crd_lines() == documented_lines()


def test_the_documented_crd_upgrade_keeps_caches_and_serves_new_fields(
    kube: RealKube, tmp_path: Path
) -> None:
    lines = documented_lines()
    env = tool_env(tmp_path / "home", kube.plane.admin_kubeconfig)
    which = printed(env, "command -v kubectl").stdout.strip()
    assert which == str(tool("kubectl")), f"bash finds {which}, not the tiers' kubectl"
    old_chart = crds_chart(tmp_path / "old", older_crds(tmp_path / "old-crds"), "0.6.0")
    new_chart = crds_chart(tmp_path / "new", CRD_DIR, "0.7.0")
    crd_names = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in CRD_DIR.glob("*.yaml")}
    strategy = {"spec": {NEW_FIELD: {"maxFetching": 2}}}
    try:
        # As on a cluster where the older chart was installed first: the CRD exists only as Helm made it.
        kube.call("DELETE", f"{CRDS}/{MODELCACHE_CRD}")
        kube.wait_until(lambda: _absent(kube, f"{CRDS}/{MODELCACHE_CRD}"), 60, "the ModelCache CRD to go")
        helm(env, "install", RELEASE, str(old_chart), "--namespace", NS, "--create-namespace")
        assert NEW_FIELD not in spec_fields(kube)
        cache = kube.create(_modelcache("before-upgrade"))
        with pytest.raises(ApiException) as refused:
            strict_patch(kube, "before-upgrade", strategy)
        assert refused.value.status == 422 and f'unknown field "spec.{NEW_FIELD}"' in _message(refused.value)

        # The premise: `helm upgrade` does not touch crds/.
        helm(env, "upgrade", RELEASE, str(new_chart), "--namespace", NS)
        assert NEW_FIELD not in spec_fields(kube)

        # Why the README says --force-conflicts: `spec.versions` is an atomic list (apiextensions v1
        # types.go, +listType=atomic) that Helm's apply owns, so any schema change is a conflict.
        for line in lines:
            assert f" {FORCE}" in line, f"{README}: {line!r} lacks {FORCE}, which the README explains"
            unforced = printed(env, line.replace(f" {FORCE}", ""))
            assert unforced.returncode != 0 and 'conflict with "helm"' in unforced.stderr, unforced
            assert FORCE in unforced.stderr  # kubectl's own advice (pkg/cmd/apply/apply.go)
        assert NEW_FIELD not in spec_fields(kube)

        applied: set[str] = set()
        for line in lines:  # the documented procedure, exactly as printed
            done = printed(env, line)
            assert done.returncode == 0, f"{README}: {line!r} fails as printed:\n{done.stdout}{done.stderr}"
            applied |= {word.rpartition("/")[2] for word in done.stdout.split() if "/" in word}
        assert applied == crd_names, f"kubectl printed {applied}"
        assert all(("kubectl", "Apply") in managers(kube, name) for name in crd_names)
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
        restore_current_crds(kube, env)


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
