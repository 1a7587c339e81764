"""Every `helm` command the documentation prints runs, exactly as printed, through the real CLI.

Lines come from README.md, docs/*.md and charts/praesto/README.md (fenced lines and inline
commands, testkit/documented_helm.py), and from the NOTES `helm install` prints. Each document
runs in its own fresh API server (etcd + kube-apiserver, this tier's build) in the order it
prints them, `bash -c '<line>'` with the built helm first on PATH and KUBECONFIG the admin's,
in a copy of the repository's layout so the printed relative paths resolve and nothing is
written into the working tree (`helm dependency build` writes charts/praesto/charts/).
Lines that reach ghcr.io (the dependency build, the OCI install) reach a local stand-in
of it under that name (testkit/ghcr_standin.py) holding the metacontroller-helm stand-in and
the chart as scripts/release.sh publishes it.

What stands in for a real cluster, and why: the documents assume cert-manager installed,
so its two CRDs the chart uses (Issuer, Certificate) are created first, schema-less
(nothing issues certificates here); no kubelet runs, so a Pod never starts, and helm does not
wait for them (Helm 4's default wait strategy is `hookOnly`). Where a document prints
alternative installs of one release (from source, from a package, from the registry), the
earlier release is uninstalled (`--no-hooks`) before the next `helm install` of that name.
Sections whose lines need Pods to run (the uninstall guard's hook Job) are run as printed by
the node tier's test, and a test here checks it runs exactly those lines (ELSEWHERE).
"""

from __future__ import annotations

import importlib
import itertools
import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.chart_install import install_crds
from testkit.controlplane import ControlPlane, ControlPlaneUnavailable, build_binaries
from testkit.documented_helm import HelmLine, documents, elided, helm_lines, notes_lines
from testkit.ghcr_standin import GhcrStandin, ghcr_standin, repo_layout
from testkit.helm_chart import CHART_DIR, ROOT
from testkit.kube_apply import Kube
from testkit.metacontroller_subchart import chart_copy_with_dependency

GUIDE = ROOT / "docs" / "user-guide.md"
CERT_MANAGER_KINDS = (("Issuer", "issuers"), ("Certificate", "certificates"))
FLAGS_WITH_VALUE = frozenset(
    {"-n", "--namespace", "--version", "--set", "--set-string", "--set-json", "--set-file",
     "--set-literal", "-f", "--values", "--timeout", "--kube-context", "--description"}
)  # fmt: skip
LINE_DEADLINE = 120.0  # seconds: no documented line run here waits for anything (no --wait, no hook)
DOCUMENTED = [d for d in documents() if helm_lines(d)]
# Sections another tier runs as printed, because their lines need what this one lacks: the
# Uninstall section's pre-delete hook is a Job whose Pod must run on a kubelet, against a
# Ready cache. (document, section) -> the function that lists the lines that test runs.
ELSEWHERE = {
    (CHART_DIR / "README.md", "Uninstall"): "tests.node.test_helm_lifecycle.uninstall_section",
}


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the documented helm lines must run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def ghcr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GhcrStandin]:
    """ghcr.io's stand-in holding the dependency and the chart, published as a release does."""
    try:
        with ghcr_standin(tmp_path_factory.mktemp("ghcr")) as standin:
            standin.publish_dependency()
            standin.publish_chart()
            yield standin
    except ControlPlaneUnavailable as err:
        _skip_or_fail(str(err))


@contextmanager
def fresh_cluster(workdir: Path) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver, nothing installed but cert-manager's CRDs (a prerequisite the docs name)."""
    try:
        binaries = build_binaries("tests/cluster")
    except ControlPlaneUnavailable as err:
        _skip_or_fail(str(err))
    plane = ControlPlane(workdir, binaries, with_controllers=False)
    try:
        plane.start()
        crds = workdir / "cert-manager-crds.yaml"
        crds.write_text(
            yaml.safe_dump_all([_schemaless_crd(kind, plural) for kind, plural in CERT_MANAGER_KINDS])
        )
        install_crds(Kube(plane.admin()), [crds])
        yield plane
    finally:
        for component in plane.components.values():  # etcd lives in a temp dir: no graceful stop needed
            component.kill()


def _schemaless_crd(kind: str, plural: str) -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.cert-manager.io"},
        "spec": {
            "group": "cert-manager.io",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}],
        },
    }


def release_of(line: HelmLine) -> tuple[str, str] | None:
    """(release, namespace) of a `helm install` line with a release name, else None."""
    words = line.argv()
    if words[1:2] != ["install"]:
        return None
    positional: list[str] = []
    namespace = "default"
    for before, word in itertools.pairwise(words[1:]):
        if before in ("-n", "--namespace"):
            namespace = word
        elif word.startswith("--namespace="):
            namespace = word.partition("=")[2]
        if word.startswith("-") or before in FLAGS_WITH_VALUE:
            continue
        positional.append(word)
    return (positional[0], namespace) if len(positional) >= 2 else None


def run_line(ghcr: GhcrStandin, line: HelmLine, cwd: Path, kube: dict[str, str]) -> str:
    """`bash -c` the line as printed; its stdout, or AssertionError naming where it is printed."""
    done = ghcr.run_unchecked(["bash", "-c", line.command], cwd, kube, timeout=LINE_DEADLINE)
    assert done.returncode == 0, (
        f"{line.where} fails as printed (exit {done.returncode}):\n  {line.command}\n{done.stdout}{done.stderr}"
    )
    return done.stdout


def uninstall_earlier(ghcr: GhcrStandin, name: str, namespace: str, cwd: Path, kube: dict[str, str]) -> None:
    """Remove a release an earlier line installed: the document printed alternative installs of it."""
    if ghcr.run_unchecked(["helm", "status", name, "-n", namespace], cwd, kube).returncode == 0:
        ghcr.run(["helm", "uninstall", name, "-n", namespace, "--no-hooks"], cwd, kube)


def working_tree_outputs() -> list[Path]:
    """What the documented commands would write if run in the working tree (fetched charts, packages)."""
    return sorted([*(ROOT / "charts" / "praesto").glob("charts/*"), *ROOT.glob("praesto-*.tgz")])


def test_documents_print_whole_commands() -> None:
    """A command with `...` or `<placeholder>` cannot be run as printed: print the whole command."""
    elisions = [f"{h.where}: {h.command}" for d in documents() for h in helm_lines(d) if elided(h)]
    assert elisions == []
    assert GUIDE in DOCUMENTED and (ROOT / "charts" / "praesto" / "README.md") in DOCUMENTED


@pytest.mark.parametrize("document", DOCUMENTED, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_documented_helm_line_runs_as_printed(
    document: Path, ghcr: GhcrStandin, tmp_path: Path
) -> None:
    untouched = working_tree_outputs()
    tunnels_before = len(ghcr.tunnels)
    layout = repo_layout(tmp_path / "repo")
    queue = [h for h in helm_lines(document) if (document, h.section) not in ELSEWHERE]
    notes_taken = False
    with fresh_cluster(tmp_path / "cluster") as plane:
        kube = {"KUBECONFIG": str(plane.admin_kubeconfig)}
        while queue:
            line = queue.pop(0)
            if (release := release_of(line)) is not None:
                uninstall_earlier(ghcr, *release, layout, kube)
            printed = run_line(ghcr, line, layout, kube)
            if release is not None and not notes_taken:  # NOTES as helm printed them, run after the document
                assert "\nNOTES:\n" in printed, f"{line.where}: helm printed no NOTES"
                queue.extend(notes_lines(printed))
                notes_taken = True
    if any("ghcr.io" in h.command or "dependency build" in h.command for h in helm_lines(document)):
        assert "ghcr.io:443" in ghcr.tunnels[tunnels_before:], "helm reached ghcr.io without the proxy"
    assert working_tree_outputs() == untouched, "a documented line wrote into the working tree"


@pytest.mark.parametrize(
    ("where", "runner"),
    sorted(ELSEWHERE.items()),
    ids=[f"{document.relative_to(ROOT)}#{section}" for document, section in sorted(ELSEWHERE)],
)
def test_sections_run_elsewhere_are_run_line_by_line_there(where: tuple[Path, str], runner: str) -> None:
    """What this test leaves to another tier is exactly what that tier's test runs."""
    document, section = where
    module, _, function = runner.rpartition(".")
    lines: list[str] = getattr(importlib.import_module(module), function)()
    printed = [h.command for h in helm_lines(document) if h.section == section]
    assert printed and lines == printed


def test_the_quickstart_sets_the_node_label_as_a_string(ghcr: GhcrStandin, tmp_path: Path) -> None:
    """The quickstart's install, as `helm template` with the same flags: the DaemonSet selects
    `praesto.io/cache-node: "true"`; the two forms it replaced fail on the chart's schema."""
    (install,) = [h for h in helm_lines(GUIDE) if h.argv()[:2] == ["helm", "install"]]
    assert "--set-string 'nodeAgent.nodeSelector.praesto\\.io/cache-node=true'" in install.command
    layout = tmp_path / "repo"
    chart_copy_with_dependency(layout / "charts")
    template = install.command.replace("helm install", "helm template", 1)
    shown = f"{template} --show-only templates/node-daemonset.yaml"
    (daemonset,) = [
        d
        for d in yaml.safe_load_all(ghcr.run(["bash", "-c", shown], layout))
        if d and d["kind"] == "DaemonSet"
    ]
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {"praesto.io/cache-node": "true"}
    for before, error in (
        ("--set nodeAgent.nodeSelector.praesto\\.io/cache-node=true", "got object, want string"),
        ("--set 'nodeAgent.nodeSelector.praesto\\.io/cache-node=true'", "got boolean, want string"),
    ):
        old = template.replace("--set-string 'nodeAgent.nodeSelector.praesto\\.io/cache-node=true'", before)
        done = ghcr.run_unchecked(["bash", "-c", old], layout)
        assert done.returncode != 0 and error in done.stderr, (shlex.quote(old), done.stderr)
