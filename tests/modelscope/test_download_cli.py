"""`praesto-agent download ms://ORG/NAME[:REV]` as a process, against the local ModelScope hub.

The same engine as hf://: byte-identical trees, resume after a SIGKILL, a wrong sha256 refused,
a private repo's token (never printed), dedup of identical files across two repos, and the
endpoint from MODELSCOPE_ENDPOINT.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.egress import LOOPBACK_ENV, LOOPBACK_FLAG
from testkit.modelscope_hub import ModelScopeHub
from tests.modelscope.conftest import sample_files, tree_of

MiB = 1 << 20
TOKEN = "ms-sEcReTtOkEn1234567890"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[ModelScopeHub]:
    with ModelScopeHub(tmp_path / "hub") as running:
        yield running


def _cli(
    hub: ModelScopeHub, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **LOOPBACK_ENV, "MODELSCOPE_ENDPOINT": hub.endpoint, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "praesto.agent.cli", "download", *args],
        capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip


def _poll(condition: Callable[[], bool], deadline_s: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _model(tree: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in tree.items() if not k.startswith(".praesto")}


def test_download_is_byte_identical_and_pins_the_commit(hub: ModelScopeHub, tmp_path: Path) -> None:
    files = sample_files()
    commit = hub.add_repo("org/model", files)
    done = _cli(hub, "ms://org/model", "--dest", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert _model(tree_of(tmp_path / "out")) == files
    assert commit in done.stdout
    listed = [path for method, path in hub.requests if path.endswith("/repo/files")]
    assert listed == ["/api/v1/models/org/model/repo/files"]  # one listing, at the pinned commit


def test_a_hub_that_names_no_commit_id_still_pins_master(hub: ModelScopeHub, tmp_path: Path) -> None:
    """The commit the file list's entries share (tests/modelscope/test_pinning.py has every case)."""
    files = sample_files()
    commit = hub.add_repo("org/model", files)
    hub.commit_ids = False
    done = _cli(hub, "ms://org/model", "--dest", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert _model(tree_of(tmp_path / "out")) == files and commit in done.stdout


def test_revision_in_the_uri_and_a_tag(hub: ModelScopeHub, tmp_path: Path) -> None:
    first = hub.add_repo("org/model", {"a.txt": b"one", "w.bin": b"1" * 4000})
    hub.tag("org/model", "v1.0", first)
    hub.commit("org/model", {"a.txt": b"two"})
    by_commit = _cli(hub, f"ms://org/model:{first}", "--dest", str(tmp_path / "c"))
    by_tag = _cli(hub, "ms://org/model:v1.0", "--dest", str(tmp_path / "t"))
    head = _cli(hub, "ms://org/model", "--dest", str(tmp_path / "h"))
    assert by_commit.returncode == by_tag.returncode == head.returncode == 0, by_tag.stderr
    assert (
        _model(tree_of(tmp_path / "c"))
        == _model(tree_of(tmp_path / "t"))
        == {"a.txt": b"one", "w.bin": b"1" * 4000}
    )
    assert _model(tree_of(tmp_path / "h")) == {"a.txt": b"two"}
    missing = _cli(hub, "ms://org/model:nope", "--dest", str(tmp_path / "n"))
    assert missing.returncode == 1 and "RevisionNotFound" in missing.stderr


def test_allow_and_ignore_patterns_select_files(hub: ModelScopeHub, tmp_path: Path) -> None:
    """The CLI's --allow-pattern/--ignore apply to ms:// as to hf:// (the CRD form takes none:
    praesto/kinds.py builds the modelscope form with patterns=False)."""
    hub.add_repo("org/model", sample_files())
    done = _cli(hub, "ms://org/model", "--dest", str(tmp_path / "out"),
                "--allow-pattern", "*.json", "--allow", "sub/", "--ignore", "sub/dir/*.bin")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(_model(tree_of(tmp_path / "out"))) == ["configuration.json", "sub/dir/tokenizer.json"]
    assert set(hub.bytes_by_path) == {"configuration.json", "sub/dir/tokenizer.json"}  # nothing else fetched


def test_private_repo_needs_its_token_which_is_never_printed(hub: ModelScopeHub, tmp_path: Path) -> None:
    files = sample_files()
    hub.add_repo("org/private", files, private=True)
    hub.tokens.add(TOKEN)
    anonymous = _cli(hub, "ms://org/private", "--dest", str(tmp_path / "a"))
    assert anonymous.returncode == 1 and "Unauthorized" in anonymous.stderr
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    done = _cli(hub, "ms://org/private", "--dest", str(tmp_path / "out"), "--token-file", str(token_file),
                "--log-level", "DEBUG")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _model(tree_of(tmp_path / "out")) == files
    assert TOKEN not in done.stdout + done.stderr
    assert any(span.cdn for span in hub.spans) and hub.cdn_credentials == 0  # the token went to the hub only


def test_a_wrong_sha256_is_refused(hub: ModelScopeHub, tmp_path: Path) -> None:
    hub.add_repo("org/model", {"w.bin": os.urandom(5000), "a.txt": b"x"})
    hub.faults.corrupt["w.bin"] = 10  # every try of the file comes back altered
    done = _cli(hub, "ms://org/model", "--dest", str(tmp_path / "out"))
    assert done.returncode == 1 and "ChecksumMismatch" in done.stderr
    assert not (tmp_path / "out").exists()


def test_sigkill_mid_download_then_resume_fetches_less_than_total(hub: ModelScopeHub, tmp_path: Path) -> None:
    big = os.urandom(24 * MiB)
    hub.add_repo("org/model", {"big.safetensors": big, "configuration.json": b"{}"})
    hub.faults.rate = 4 * MiB  # per response: slow enough to kill mid-way
    stage, dest = tmp_path / "stage", tmp_path / "dest"
    args = ["download", "ms://org/model", "--dest", str(dest), "--staging-dir", str(stage),
            "--part-size", "1", "--concurrency", "4", "--quiet", LOOPBACK_FLAG]  # fmt: skip
    env = {**os.environ, "MODELSCOPE_ENDPOINT": hub.endpoint}
    proc = subprocess.Popen(
        [sys.executable, "-m", "praesto.agent.cli", *args], stderr=subprocess.DEVNULL, env=env
    )
    journal = stage / ".praesto-journal"

    def journaled_parts() -> int:
        lines = journal.read_text().splitlines()[1:] if journal.exists() else []
        return sum(len(json.loads(line).get("parts", [])) for line in lines if line.endswith("}"))

    try:
        _poll(lambda: journaled_parts() >= 6, 60, "six journaled parts")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not dest.exists()
    hub.reset_counters()
    hub.faults.rate = 0
    again = _cli(hub, *args[1:])
    assert again.returncode == 0, again.stderr
    assert (dest / "big.safetensors").read_bytes() == big
    assert hub.bytes_served < len(big) - 5 * MiB


def test_identical_files_in_two_repos_are_fetched_once(hub: ModelScopeHub, tmp_path: Path) -> None:
    shared = os.urandom(3 * MiB)
    hub.add_repo("org/one", {"w.bin": shared, "a.txt": b"one"})
    hub.add_repo("org/two", {"weights/w.bin": shared, "a.txt": b"two"})
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    first = _cli(hub, "ms://org/one", "--dest", str(tmp_path / "one"), "--blobs-dir", str(blobs))
    assert first.returncode == 0, first.stderr
    hub.reset_counters()
    second = _cli(hub, "ms://org/two", "--dest", str(tmp_path / "two"), "--blobs-dir", str(blobs))
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "two" / "weights" / "w.bin").read_bytes() == shared
    assert hub.bytes_served < MiB  # the shared file came from the blob area, not the hub
    assert (tmp_path / "two" / "weights" / "w.bin").stat().st_ino == (
        tmp_path / "one" / "w.bin"
    ).stat().st_ino


def test_the_token_from_the_variable_the_pvc_job_sets(hub: ModelScopeHub, tmp_path: Path) -> None:
    """The PVC-mode Job hands a ModelScope token over as MODELSCOPE_API_TOKEN (praesto/kinds.py)."""
    hub.add_repo("org/private", {"a.txt": b"x"}, private=True)
    hub.tokens.add(TOKEN)
    done = _cli(hub, "ms://org/private", "--dest", str(tmp_path / "out"), env={"MODELSCOPE_API_TOKEN": TOKEN})
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr


def test_a_hugging_face_token_never_goes_to_modelscope(hub: ModelScopeHub, tmp_path: Path) -> None:
    """Each kind reads its own variable: an exported HF_TOKEN is not sent to a ModelScope hub."""
    hub.add_repo("org/private", {"a.txt": b"x"}, private=True)
    hub.tokens.add(TOKEN)
    done = _cli(hub, "ms://org/private", "--dest", str(tmp_path / "out"), env={"HF_TOKEN": TOKEN})
    assert done.returncode != 0
    assert not (tmp_path / "out" / "a.txt").exists()


def test_praesto_plan_reads_the_file_list_before_a_cache_exists(hub: ModelScopeHub, tmp_path: Path) -> None:
    commit = hub.add_repo("org/model", {"a.txt": b"x", "w.bin": b"y" * 5000})
    manifest = tmp_path / "modelcache.yaml"
    manifest.write_text(
        "apiVersion: praesto.praesto.io/v1alpha1\nkind: ModelCache\nmetadata: {name: m, namespace: team-a}\n"
        "spec:\n  source:\n    modelscope: {repo: org/model}\n  storage: {size: 1Gi}\n"
    )
    environment = {**os.environ, **LOOPBACK_ENV, "MODELSCOPE_ENDPOINT": hub.endpoint}
    done = subprocess.run([str(Path(sys.executable).parent / "praesto"), "plan", "-f", str(manifest)],
                          capture_output=True, text=True, timeout=60, env=environment)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"ms://org/model master -> {commit}: 2 files" in done.stdout and "fits" in done.stdout
