"""Chart.lock is in step with Chart.yaml, as the real Helm engine judges it.

`helm dependency build` refuses a lock whose digest does not match the
dependencies ("out of sync"), before it downloads anything. The test runs that
build (helm-python-sdk, Helm's own Go code) on a copy of the chart with every
download sent to a closed loopback proxy: a lock in step gets as far as the
download and fails there; a stale one fails on the digest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from testkit.helm_chart import CHART_DIR

BUILD = "import sys, helm_python; helm_python.dependency_build(sys.argv[1], skip_refresh=True)"


def build(chart: Path) -> str:
    closed = "http://127.0.0.1:9"  # nothing listens: no request leaves the machine
    env = {**os.environ, "HTTPS_PROXY": closed, "HTTP_PROXY": closed, "NO_PROXY": ""}
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(chart)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    return done.stderr


def test_the_lock_matches_the_dependencies(tmp_path: Path) -> None:
    chart = tmp_path / "praesto"
    shutil.copytree(CHART_DIR, chart)
    error = build(chart)
    assert "out of sync" not in error
    assert "could not download oci://ghcr.io/metacontroller/metacontroller-helm" in error


def test_a_stale_lock_is_caught(tmp_path: Path) -> None:
    chart = tmp_path / "praesto"
    shutil.copytree(CHART_DIR, chart)
    lock = yaml.safe_load((chart / "Chart.lock").read_text())
    lock["digest"] = "sha256:" + "0" * 64
    (chart / "Chart.lock").write_text(yaml.safe_dump(lock))
    assert "out of sync" in build(chart)


def test_the_lock_pins_the_dependency_chart_yaml_names() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    lock = yaml.safe_load((CHART_DIR / "Chart.lock").read_text())
    assert [(d["name"], d["version"], d["repository"]) for d in lock["dependencies"]] == [
        (d["name"], d["version"], d["repository"]) for d in chart["dependencies"]
    ]
