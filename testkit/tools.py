"""The upstream CLIs the chart, alert and release checks run: `helm` (helm.sh/helm/v4 v4.3.2) and
`promtool` (prometheus v0.316.0) and `kubectl` (k8s.io/kubectl v0.37.2, the tiers' release) built from
tests/tools, `actionlint` (v1.7.12) from tests/actionlint
(its own module: it needs go.yaml.in/yaml/v4 rc.3, whose API the newer rc helm and prometheus
require took away).

Built on first use and cached by content in build/cluster/<key>/ like the tiers' binaries;
`tool()` raises ControlPlaneUnavailable where no Go toolchain can build them (a skip outside CI).
"""

from __future__ import annotations

from pathlib import Path

from testkit.controlplane import build_binaries

MODULES = {
    "helm": "tests/tools",
    "promtool": "tests/tools",
    "kubectl": "tests/tools",
    "actionlint": "tests/actionlint",
}
NAMES = tuple(MODULES)


def tools_dir() -> Path:
    """build/cluster/<key>/ holding helm, promtool and kubectl."""
    return build_binaries(MODULES["helm"])


def tool(name: str) -> Path:
    """The path of one built tool, by its command name."""
    if name not in MODULES:
        raise ValueError(f"unknown tool {name!r}; the tools modules build {', '.join(NAMES)}")
    return build_binaries(MODULES[name]) / name
