"""`praesto plan`, "will it fit?", run as users run it (the venv's console script) against the local hub.

The sizes it adds up are the hub's real file sizes, planned by the agent's own planner, and no
byte of a file is fetched. The command the user guide prints is run here exactly as printed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from praesto import names
from praesto.quantity import format_bytes
from testkit.hub import LocalHub
from tests.test_cli_bad_input import BIN, refused
from tests.test_docs import commands

FILES = {
    "config.json": b'{"model_type": "test"}',
    "tokenizer.json": b"{}" * 100,
    "model.safetensors": os.urandom(3 << 20),
    "extra/notes.md": b"# notes\n",
}
TOTAL = sum(len(data) for data in FILES.values())


def cache(name: str, size: str, source: str = "uri: hf://org/model") -> str:
    return f"""apiVersion: {names.API_VERSION}
kind: ModelCache
metadata: {{name: {name}, namespace: team-a}}
spec:
  source: {{{source}}}
  storage: {{size: {size}}}
"""


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[LocalHub]:
    with LocalHub(tmp_path / "hub") as server:
        server.add_repo("org/model", FILES)
        yield server


def plan(
    hub: LocalHub, *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "praesto"), "plan", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, names.ENV_HF_ENDPOINT: hub.endpoint},
    )


def test_the_guides_command_as_printed_says_it_fits(hub: LocalHub, tmp_path: Path) -> None:
    printed = [argv for argv in commands() if argv[:2] == ["praesto", "plan"]]
    assert printed == [["praesto", "plan", "-f", "modelcache.yaml"]]
    (tmp_path / "modelcache.yaml").write_text(cache("tiny", "5Mi"))
    done = subprocess.run(shlex.join(printed[0]), shell=True, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}",
                                             names.ENV_HF_ENDPOINT: hub.endpoint})  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    commit = hub.repos["org/model"].refs["main"]
    assert first == (f"ModelCache team-a/tiny: hf://org/model main -> {commit}: 4 files, "
                     f"3.0 MiB ({TOTAL} bytes); storage.size 5Mi ({5 << 20} bytes)")  # fmt: skip
    assert second == f"ModelCache team-a/tiny: fits ({100 * TOTAL // (5 << 20)}% of storage.size)"
    assert done.stderr == ""
    assert hub.bytes_served == 0  # listed, not fetched


def test_a_cache_smaller_than_its_source_is_a_warning_and_exit_1(hub: LocalHub) -> None:
    done = plan(hub, "-f", "-", stdin=cache("small", "3Mi"))
    assert done.returncode == 1
    assert f"4 files, 3.0 MiB ({TOTAL} bytes); storage.size 3Mi ({3 << 20} bytes)" in done.stdout
    (warning,) = done.stderr.splitlines()
    assert warning.startswith("WARNING: ModelCache team-a/small will not fit: SizeExceedsRequest:")
    assert f"({TOTAL} bytes)" in warning and "raise storage.size" in warning
    assert hub.bytes_served == 0


def test_every_cache_in_the_file_is_planned_with_its_own_patterns(hub: LocalHub) -> None:
    both = "---\n".join([
        cache("weights", "4Mi", source="huggingface: {repo: org/model, allowPatterns: ['*.safetensors']}"),
        cache("no-weights", "200",
              source="huggingface: {repo: org/model, ignorePatterns: ['*.safetensors', 'extra/*']}"),
    ])  # fmt: skip
    done = plan(hub, "-f", "-", "--files", stdin=both)
    assert done.returncode == 1, done.stderr  # the second one (222 bytes) does not fit in 200
    weights = len(FILES["model.safetensors"])
    assert "ModelCache team-a/weights: hf://org/model main -> " in done.stdout
    assert f"1 files, 3.0 MiB ({weights} bytes)" in done.stdout
    small = len(FILES["config.json"]) + len(FILES["tokenizer.json"])
    assert f"2 files, {format_bytes(small)} ({small} bytes); storage.size 200 (200 bytes)" in done.stdout
    assert f"  {weights:>14}  model.safetensors" in done.stdout.splitlines()
    assert "ModelCache team-a/weights: fits" in done.stdout
    assert "ModelCache team-a/no-weights will not fit" in done.stderr


def test_a_source_that_cannot_be_planned_says_why(hub: LocalHub) -> None:
    done = plan(hub, "-f", "-", stdin=cache("gone", "1Gi", source="uri: hf://org/missing"))
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("praesto plan: ModelCache team-a/gone: ") and "hf://org/missing" in line


def test_bad_input_is_one_line_and_exit_2(hub: LocalHub, tmp_path: Path) -> None:
    refused(plan(hub, "-f", str(tmp_path / "none.yaml")), "none.yaml: cannot read")
    refused(plan(hub, "-f", "-", stdin="kind: Pod\n"), "contains no object of kind ModelCache")
    refused(plan(hub, "-f", "-", stdin=cache("bad", "lots")), "spec.storage.size", "e.g. 5Gi")
    refused(plan(hub), "-f/--filename", "see praesto plan --help")
    assert hub.requests == []
