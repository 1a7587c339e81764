"""`praesto-agent download` / `wait` as processes: exit codes, secrecy, SIGKILL resume, disk full."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from praesto.agent.download.crashpoints import COMPLETE_WRITTEN, FILE_READ_ONLY, MARKER_POINTS, POINTS
from praesto.agent.download.publish import STAGING_IN_DEST

from praesto import names
from testkit.egress import LOOPBACK_ENV, LOOPBACK_FLAG
from testkit.hub import LocalHub
from tests.download.conftest import MiB, sample_files, tree_of

TOKEN = "hf_sEcReTtOkEn1234567890"


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "praesto.agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **LOOPBACK_ENV, **(env or {})},  # the test's origins are on loopback
    )


def _poll(condition: object, deadline_s: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_download_cli_success_private_repo_token_from_env_never_printed(
    hub: LocalHub, tmp_path: Path
) -> None:
    files = sample_files()
    commit = hub.add_repo("org/private", files, private=True)
    hub.tokens.add(TOKEN)
    dest = tmp_path / "out"
    done = _cli("download", "hf://org/private", "--dest", str(dest), "--endpoint", hub.endpoint,
                "--log-level", "DEBUG", env={"HF_TOKEN": TOKEN})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert tree_of(dest) == files
    assert commit in done.stdout and "complete" in done.stdout
    assert TOKEN not in done.stdout + done.stderr
    assert TOKEN not in "".join(p.read_text() for p in dest.glob(".praesto-*"))


def test_download_cli_errors_exit_codes_and_reasons(hub: LocalHub, tmp_path: Path) -> None:
    hub.add_repo("org/gated", {"w.bin": os.urandom(2000)}, gated=True)
    hub.tokens.add(TOKEN)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    gated = _cli("download", "hf://org/gated", "--dest", str(tmp_path / "g"), "--endpoint", hub.endpoint,
                 "--token-file", str(token_file))  # fmt: skip
    assert gated.returncode == 1 and "GatedRepo" in gated.stderr and TOKEN not in gated.stderr
    missing = _cli(
        "download", "hf://org/none", "--dest", str(tmp_path / "n"), env={"HF_ENDPOINT": hub.endpoint}
    )
    assert missing.returncode == 1 and "error: Unauthorized" in missing.stderr
    bad = _cli("download", "ftp://x", "--dest", str(tmp_path / "x"))
    assert bad.returncode == 2 and "SOURCE" in bad.stderr
    no_file = _cli(
        "download", "hf://org/gated", "--dest", str(tmp_path / "x"), "--token-file", "/nonexistent"
    )
    assert no_file.returncode == 2 and "--token-file" in no_file.stderr
    hub.faults.fail_first, hub.faults.retry_after = 10_000, "0"
    down = _cli("download", "hf://org/gated", "--dest", str(tmp_path / "y"), "--endpoint", hub.endpoint,
                "--token-file", str(token_file))  # fmt: skip
    assert down.returncode in (1, 75) and "error:" in down.stderr


def test_sigkill_mid_download_then_resume_fetches_less_than_total(hub: LocalHub, tmp_path: Path) -> None:
    big = os.urandom(24 * MiB)
    hub.add_repo("org/model", {"big.safetensors": big, "config.json": b"{}"})
    hub.faults.rate = 4 * MiB  # per response: slow enough to kill mid-way
    stage, dest = tmp_path / "stage", tmp_path / "dest"
    args = ["download", "hf://org/model", "--dest", str(dest), "--endpoint", hub.endpoint,
            "--staging-dir", str(stage), "--part-size", "1", "--concurrency", "4", "--quiet", LOOPBACK_FLAG]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "praesto.agent.cli", *args], stderr=subprocess.DEVNULL)
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
    again = _cli(*args)
    assert again.returncode == 0, again.stderr
    assert (dest / "big.safetensors").read_bytes() == big
    assert hub.bytes_served < len(big) - 5 * MiB


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_disk_full_fails_cleanly_and_gives_space_back(hub: LocalHub, tmp_path: Path) -> None:
    hub.add_repo("org/model", {"a.safetensors": os.urandom(6 * MiB), "b.safetensors": os.urandom(6 * MiB)})
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], check=True)
    try:
        free_before = shutil.disk_usage(small).free
        dest = small / "ns" / "model"
        done = _cli("download", "hf://org/model", "--dest", str(dest), "--endpoint", hub.endpoint,
                    "--staging-dir", str(small / ".praesto" / "staging"))  # fmt: skip
        assert done.returncode == 1 and "InsufficientDiskSpace" in done.stderr
        assert not dest.exists()
        assert not (small / ".praesto" / "staging").exists()
        assert shutil.disk_usage(small).free >= free_before - 64 * 1024
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_wait_returns_when_complete_and_times_out_otherwise(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    target.mkdir()
    timed_out = _cli("wait", "--path", str(target), "--timeout", "0.2")
    assert timed_out.returncode == 1 and names.COMPLETE_FILE in timed_out.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "praesto.agent.cli", "wait", "--path", str(target), "--timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    assert "waiting" in proc.stderr.readline()  # it is polling now
    (target / names.COMPLETE_FILE).write_text("abc\n")
    assert proc.wait(timeout=30) == 0


# The node agent runs as uid 65532; root would write a read-only file anyway. As root, drop the
# capability that lets it (setpriv, util-linux) so the resumed run meets the same EACCES.
WITHOUT_DAC_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


@pytest.mark.parametrize("pvc", [False, True], ids=["node-copy", "pvc"])
@pytest.mark.parametrize("point", POINTS)
def test_a_kill_at_each_step_resumes_to_a_verified_published_cache(
    point: str, pvc: bool, hub: LocalHub, tmp_path: Path
) -> None:
    """SIGKILL at every step boundary of the crash-safety protocol (engine.py, publish.py), then resume,
    for both destination shapes (a node copy renamed into place, a PVC filled in place).

    `file-read-only` is the stuck-state finding: chmod 0444 came before the "verified" journal
    entry, and the resumed run (uid 65532) could not reopen the file, retried for ever. The
    `written-not-renamed:<file>` points are the same class for every file the publisher writes
    (#21 item 20): a read-only `.tmp` left by the kill must not fail every later run."""
    files = {"model.safetensors": os.urandom(4 * MiB), "config.json": b"{}"}
    hub.add_repo("org/model", files)
    hub.faults.rate = 2 * MiB  # per response, one part at a time: parts are journaled before the end
    work = tmp_path / "work"
    work.mkdir()
    prefix = WITHOUT_DAC_OVERRIDE if os.geteuid() == 0 and shutil.which("setpriv") else []
    stage, dest = work / "stage", work / "dest"
    if pvc:  # an existing destination is a volume filled in place, staging inside it
        dest.mkdir()
        stage = dest / STAGING_IN_DEST
    args = [*prefix, sys.executable, "-m", "praesto.agent.cli", "download", "hf://org/model", "--dest", str(dest),
            "--endpoint", hub.endpoint, "--staging-dir", str(work / "stage"), "--part-size", "1",
            "--concurrency", "1", "--quiet"]  # fmt: skip
    env = {**os.environ, **LOOPBACK_ENV, "HOME": str(work), "HF_HOME": str(work / "hf")}
    killed = subprocess.run(
        args, env={**env, "PRAESTO_CRASH_AT": point}, capture_output=True, text=True, timeout=60
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    if point == FILE_READ_ONLY:
        read_only = [p for p in (stage / "tree").rglob("*") if p.is_file() and not p.stat().st_mode & 0o200]
        assert read_only, "the crash point must leave a verified, read-only, unjournaled file"
    if point in MARKER_POINTS:
        left = [p for p in work.rglob("*.tmp") if p.name == point.split(":", 1)[1] + ".tmp"]
        assert left, f"the crash point must leave {point.split(':', 1)[1]}.tmp behind"
    assert not (dest / names.COMPLETE_FILE).exists() or point == COMPLETE_WRITTEN
    hub.faults.rate = 0
    resumed = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert tree_of(dest) == files
    assert not list(work.rglob("*.tmp")), "no temporary file is left once the cache is published"
    manifest = json.loads((dest / names.MANIFEST_FILE).read_text())
    digests = {f["path"]: f["sha256"] for f in manifest["files"]}
    assert digests == {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
