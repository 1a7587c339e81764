"""The Go modules the real tiers build from stay on one Kubernetes release."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def requirements(go_mod: Path) -> dict[str, str]:
    """Module path -> version for every `require` and `replace ... => path version` line."""
    found: dict[str, str] = {}
    for line in go_mod.read_text().splitlines():
        replaced = re.match(r"\s*(\S+) => (\S+) (v\S+)", line)
        required = re.match(r"\s*(k8s\.io/\S+|go\.etcd\.io/\S+) (v\S+)", line)
        if replaced:
            found[replaced.group(1)] = replaced.group(3)
        elif required and required.group(1) not in found:
            found[required.group(1)] = required.group(2)
    return found


def test_the_node_tiers_kubelet_is_the_control_planes_kubernetes_release() -> None:
    control_plane = requirements(ROOT / "tests" / "cluster" / "go.mod")
    node = requirements(ROOT / "tests" / "node" / "go.mod")
    assert node["k8s.io/kubernetes"] == control_plane["k8s.io/kubernetes"]
    shared = {m for m in node.keys() & control_plane.keys() if m.startswith("k8s.io/")}
    assert {m for m in shared if node[m] != control_plane[m]} == set()
    assert len(shared) > 20  # every staging module is replaced with the same release in both
