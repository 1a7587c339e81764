"""The upstream CLIs the chart, alert and release checks run (built from tests/tools): `helm`
(helm.sh/helm/v4 v4.3.2), `promtool` (prometheus v0.316.0) and `actionlint` (v1.7.12).

Built on first use and cached by content in build/cluster/<key>/ like the tiers' binaries;
`tool()` raises ControlPlaneUnavailable where no Go toolchain can build them (a skip outside CI).
"""

from __future__ import annotations

from pathlib import Path

from testkit.controlplane import build_binaries

MODULE = "tests/tools"
NAMES = ("helm", "promtool", "actionlint")


def tools_dir() -> Path:
    """build/cluster/<key>/ holding every tool in NAMES."""
    return build_binaries(MODULE)


def tool(name: str) -> Path:
    """The path of one built tool, by its command name."""
    if name not in NAMES:
        raise ValueError(f"unknown tool {name!r}; tests/tools builds {', '.join(NAMES)}")
    return tools_dir() / name
