"""scripts/release.sh, the release path `make image` and .github/workflows/release.yml share.

Its publishing (`chart push`) runs against a local stand-in of ghcr.io in
tests/cluster/test_documented_helm_lines.py; here: the names it reads from the chart, the
tag check, and `make image`'s answer where no builder can run.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from testkit.helm_chart import CHART_DIR, ROOT

SCRIPT = ROOT / "scripts" / "release.sh"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def release(
    *args: str, path: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    run_env = {"PATH": path if path is not None else "/usr/bin:/bin", **(env or {})}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=run_env, capture_output=True, text=True, timeout=60, check=False
    )


def bin_without_builders(tmp_path: Path) -> str:
    """A PATH with what the script needs and no docker, podman or buildah."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("bash", "awk", "dirname"):
        found = shutil.which(name)
        assert found is not None, name
        (folder / name).symlink_to(found)
    return str(folder)


def test_names_come_from_the_chart() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    done = release("names")
    assert done.returncode == 0, done.stderr
    names = dict(line.split("=", 1) for line in done.stdout.splitlines())
    owner = values["image"]["repository"].rsplit("/", 1)[0]
    assert names == {
        "version": chart["version"],
        "app_version": chart["appVersion"],
        "image": values["image"]["repository"],
        "chart_repository": f"oci://{owner}/charts",
    }


def test_the_tag_must_be_the_chart_version() -> None:
    version = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["version"]
    assert release("check", f"v{version}").returncode == 0
    assert release("check", version).returncode == 0
    wrong = release("check", "v0.0.1")
    assert wrong.returncode == 1
    assert wrong.stderr.count("\n") == 1 and f"tag v{version}" in wrong.stderr
    missing = release("check")
    assert missing.returncode == 2 and "give the release tag" in missing.stderr


def test_make_image_says_in_one_line_that_no_builder_is_there(tmp_path: Path) -> None:
    done = release("image", path=bin_without_builders(tmp_path))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert all(name in done.stderr for name in ("docker", "podman", "buildah"))


@pytest.mark.parametrize(("builder", "code"), [("kaniko", 2), ("podman", 1)])
def test_an_image_builder_asked_for_must_be_one_we_know_and_present(
    tmp_path: Path, builder: str, code: int
) -> None:
    done = release("image", path=bin_without_builders(tmp_path), env={"IMAGE_BUILDER": builder})
    assert done.returncode == code
    assert done.stderr.count("\n") == 1 and f"IMAGE_BUILDER={builder}" in done.stderr


def test_the_workflow_publishes_both_architectures_at_the_chart_version() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    steps = workflow["jobs"]["release"]["steps"]
    runs = "\n".join(step.get("run", "") for step in steps)
    assert 'scripts/release.sh check "$GITHUB_REF_NAME"' in runs
    assert "scripts/release.sh chart push" in runs
    (build,) = [s for s in steps if s.get("uses", "").startswith("docker/build-push-action@")]
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["tags"] == "${{ steps.names.outputs.image }}:${{ steps.names.outputs.app_version }}"
