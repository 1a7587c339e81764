"""`make run` ends quietly and cleanly on Ctrl-C, sent as a terminal sends it: to the process group.

The job starts exactly as the Makefile's `run` recipe starts it (its `$(PY) ...` line, with the
venv's python and the venv first on PATH), in a process group of its own. Once it prints that it
is ready, SIGINT goes to the whole group, and the test checks that the job exits within a
deadline with status 0 (tests/node/local_cluster.py says why 0), prints no traceback, error or
warning line, and leaves no process, mount or other node state on the machine. Twice: the
failures this guards against (the leftover check racing the shims' own exit; praesto-hooks
quitting on the SIGINT under the Metacontroller stand-in) came one run in two. Once more with
Ctrl-C while it starts (everything up but the Pod): the start unwinds the same way. Before the
Ctrl-C, each `kubectl` command it prints is run as printed (they name the cache it made).

The job brings up a node of its own and the node tier is one per machine, so this file must run
before the session's node fixture starts: tests/node/conftest.py orders it first (NODES_OF_THEIR_OWN),
and a guard fails it clearly if a node is up all the same.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from testkit import node_host
from testkit.controlplane import ControlPlaneUnavailable, build_binaries
from testkit.real_node import node_binaries
from tests.node.local_cluster import DONE_LINE, READY_LINE, WAITING_LINE, WORKDIR

ROOT = Path(__file__).resolve().parents[2]
READY_DEADLINE = 480.0  # a cold start builds the node's images; warm, it is up in about a minute
EXIT_DEADLINE = 120.0  # the teardown: drain, stop, clean up, check (seconds when all goes well)
ERROR_WORDS = ("Traceback", "Error", "Exception", "WARNING", "warning")


def make_run_argv() -> list[str]:
    """The command of the Makefile's `run` recipe that starts the job; `$(PY)` is the venv's python."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("run:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    (command,) = [line for line in recipe if line.startswith("$(PY) ")]
    return [sys.executable, *shlex.split(command.removeprefix("$(PY)"))]


class Job:
    """The job in a process group of its own, its output read line by line as it comes."""

    def __init__(self) -> None:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        self.process = subprocess.Popen(
            make_run_argv(),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        assert self.process.stdout is not None and self.process.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str], into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(["--- stdout", *self.stdout, "--- stderr", *self.stderr])

    def wait_line(self, line: str) -> None:
        end = time.monotonic() + READY_DEADLINE
        while line not in self.stdout:
            if self.process.poll() is not None:
                pytest.fail(f"make run exited ({self.process.returncode}) before {line!r}:\n{self.output()}")
            if time.monotonic() > end:
                pytest.fail(f"make run did not say {line!r} within {READY_DEADLINE:.0f}s:\n{self.output()}")
            time.sleep(0.2)  # poll interval, bounded by the deadline above

    def ctrl_c(self) -> int:
        """SIGINT to the job's whole process group, as a terminal sends Ctrl-C; its exit status."""
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            code = self.process.wait(EXIT_DEADLINE)
        except subprocess.TimeoutExpired:
            pytest.fail(f"make run still running {EXIT_DEADLINE:.0f}s after Ctrl-C:\n{self.output()}")
        for reader in self._readers:
            reader.join(10)
        return code

    def stop(self) -> None:
        """After a failure: SIGTERM (the job's own orderly teardown), then SIGKILL at the deadline."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(EXIT_DEADLINE)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(EXIT_DEADLINE)


def run_printed_commands(stdout: list[str]) -> None:
    """The commands the job prints to try (its indented lines), run as printed: each succeeds."""
    commands = [line.strip() for line in stdout if line.startswith("  ")]
    assert commands, stdout
    for command in commands:
        result = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0 and result.stdout, f"{command}:\n{result.stdout}{result.stderr}"


def processes_of_the_job() -> list[str]:
    """Processes whose command line names the job's work dir: the control plane, kubelet,
    containerd, its shims, praesto-hooks, the agent and the CSI plugin all do."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(WORKDIR) in cmdline:
            found.append(f"{proc.name}: {cmdline.strip()}")
    return found


@pytest.fixture(scope="module")
def binaries() -> None:
    """Built before the job starts (what `make run` builds first), so its start is a warm one."""
    if os.geteuid() != 0:
        reason = "make run starts a kubelet and containerd, which need root"
        if os.environ.get("CI"):
            pytest.fail(f"the node tier must run in CI: {reason}")
        pytest.skip(reason)
    try:
        build_binaries()
        node_binaries()
    except ControlPlaneUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"the node tier must run in CI: {err}")
        pytest.skip(str(err))


@pytest.mark.timeout(READY_DEADLINE + 2 * EXIT_DEADLINE + 60)
@pytest.mark.parametrize("when", ["ready-1", "ready-2", "starting"])
def test_ctrl_c_ends_make_run_quietly_and_leaves_nothing(binaries: None, when: str) -> None:
    assert node_host.NODE_LINK not in node_host.links(), (
        "a node tier is already up on this machine (its node address link exists): this test starts"
        " its own node, so it runs first in tests/node, or alone"
    )
    before = node_host.Footprint.now(WORKDIR)
    job = Job()
    try:
        job.wait_line(WAITING_LINE if when == "starting" else READY_LINE)
        if when != "starting":
            run_printed_commands(job.stdout)
        code = job.ctrl_c()
    finally:
        job.stop()
    output = job.output()
    assert code == 0, f"exit status {code} after Ctrl-C:\n{output}"
    assert job.stdout[-1:] == [DONE_LINE], output
    assert not job.stderr, output
    noisy = [line for line in job.stdout if any(word in line for word in ERROR_WORDS)]
    assert not noisy, output
    assert node_host.Footprint.now(WORKDIR).added_since(before) == {}
    assert processes_of_the_job() == []
