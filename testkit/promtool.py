"""The real `promtool` (prometheus v0.316.0 cmd/promtool, built by tests/tools) for the alert and
dashboard checks: skipped where no Go toolchain can build it, a failure in CI."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testkit.controlplane import ControlPlaneUnavailable
from testkit.tools import tool

DEADLINE = 120.0  # seconds; `promtool test rules` of every group takes about a second


def binary() -> Path:
    try:
        return tool("promtool")
    except ControlPlaneUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"the alert checks run the real promtool in CI: {err}")
        pytest.skip(str(err))


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`promtool <args>`, its output kept for the assertion's message."""
    return subprocess.run(
        [str(binary()), *args], cwd=cwd, capture_output=True, text=True, timeout=DEADLINE, check=False
    )
