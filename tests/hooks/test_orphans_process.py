"""praesto-orphans as users run it (the venv's console script): its settings refuse bad input in one
line before any work, and the process releases a deleted Node's copy on the real API server as its
own ServiceAccount (`praesto.rbac.ORPHANS`), keeps the heartbeat its liveness probe reads, and stops
cleanly on SIGTERM. praesto-hooks --release-orphaned-copies refuses the releaser's bad settings itself."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from praesto import names, rbac
from testkit.controlplane import write_kubeconfig
from testkit.kube_real import RealKube
from testkit.objects import modelcachenode
from tests.test_cli_bad_input import BIN, refused, run

DEADLINE = 30.0  # seconds; a busy 2-core machine starts the client in about 1


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (["--resync-seconds", "abc"], {}, ["--resync-seconds", "a positive integer"]),
        (["--resync-seconds", "5"], {}, ["--resync-seconds", "at least 30"]),
        (["--log-level", "LOUD"], {}, ["--log-level", "DEBUG, INFO"]),
        (
            [],
            {"PRAESTO_ORPHANS_RESYNC_SECONDS": "soon"},
            ["PRAESTO_ORPHANS_RESYNC_SECONDS", "positive integer"],
        ),
        ([], {"PRAESTO_LOG_LEVEL": "loud"}, ["PRAESTO_LOG_LEVEL", "unset it"]),
        (["--probe"], {}, ["--probe needs --heartbeat-file"]),
        (
            ["--probe", "--heartbeat-file=/tmp/x", "--stale-after=0"],
            {},
            ["--stale-after must be more than 0"],
        ),
        ([], {"KUBECONFIG": "/nonexistent/kubeconfig"}, ["no Kubernetes client configuration", "KUBECONFIG"]),
        (["--bogus"], {}, ["unrecognized arguments: --bogus", "--help"]),
    ],
)
def test_bad_input_is_one_line_before_any_work(
    args: list[str], env: dict[str, str], words: list[str]
) -> None:
    refused(run("praesto-orphans", *args, env=env), "praesto-orphans", *words)


def test_help_and_version_name_the_program() -> None:
    done = run("praesto-orphans", "--help")
    assert (
        done.returncode == 0 and "PRAESTO_ORPHANS_RESYNC_SECONDS" in done.stdout and "--probe" in done.stdout
    )
    assert run("praesto-orphans", "--version").stdout.startswith("praesto-orphans ")


def _probe(heartbeat: Path, stale_after: float = 5) -> int:
    done = run("praesto-orphans", "--probe", f"--heartbeat-file={heartbeat}", f"--stale-after={stale_after}")
    return done.returncode


def _eventually(check: Callable[[], bool], what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    end = time.monotonic() + DEADLINE
    while not check():
        if process.poll() is not None or time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what} (exit {process.poll()}):\n{log.read_text()}")
        time.sleep(0.05)  # poll interval, bounded by the deadline above


def test_the_process_releases_a_deleted_nodes_copy_and_keeps_its_heartbeat(
    kube: RealKube, tmp_path: Path
) -> None:
    mcn = f"{names.MODELCACHENODE_PLURAL}.{names.GROUP}"
    for node in ("alive", "doomed"):
        kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        held = modelcachenode("c", node, "t")
        held["metadata"]["finalizers"] = [names.FINALIZER_NODE_AGENT]
        kube.create(held)
    token = kube.identity("praesto-system", "praesto-orphans", rbac.ORPHANS)
    plane = kube.plane
    kubeconfig = write_kubeconfig(tmp_path / "hooks.kubeconfig", plane.server, plane.ca_path, token=token)
    heartbeat, log = tmp_path / "heartbeat", tmp_path / "orphans.log"
    assert _probe(heartbeat) == 1  # nothing running yet
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BIN / "praesto-orphans"), f"--heartbeat-file={heartbeat}",
             "--heartbeat-seconds=0.2", "--resync-seconds=30"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )  # fmt: skip
    try:
        _eventually(heartbeat.exists, "the first heartbeat", process, log)
        assert _probe(heartbeat) == 0
        kube.delete(mcn, names.modelcachenode_name("c", "alive"), "t")  # marked; its node still runs
        kube.delete(mcn, names.modelcachenode_name("c", "doomed"), "t")
        kube.delete("nodes", "doomed")
        _eventually(
            lambda: kube.get(mcn, names.modelcachenode_name("c", "doomed"), "t") is None,
            "the orphan released",
            process,
            log,
        )
        kept = kube.get(mcn, names.modelcachenode_name("c", "alive"), "t")
        assert kept is not None and kept["metadata"]["finalizers"] == [names.FINALIZER_NODE_AGENT]
        _eventually(lambda: "released node copy t/" in log.read_text(), "the release logged", process, log)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE) == 0, log.read_text()
        past = time.time() - 60
        os.utime(heartbeat, (past, past))  # what a stopped releaser's heartbeat looks like a minute on
        assert _probe(heartbeat, stale_after=30) == 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=DEADLINE)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"PRAESTO_ORPHANS_RESYNC_SECONDS": "5"}, ["PRAESTO_ORPHANS_RESYNC_SECONDS", "at least 30"]),
        ({"PRAESTO_ORPHANS_RESYNC_SECONDS": "soon"}, ["PRAESTO_ORPHANS_RESYNC_SECONDS", "positive integer"]),
        ({"PRAESTO_LOG_LEVEL": "loud"}, ["PRAESTO_LOG_LEVEL", "unset it"]),
    ],
)
def test_praesto_hooks_refuses_the_releasers_bad_settings_itself(
    env: dict[str, str], words: list[str]
) -> None:
    """Not a child that exits 2 after gunicorn started (its master reaps any child unseen): one line
    from praesto-hooks before it serves, naming the variable."""
    refused(
        run("praesto-hooks", "--release-orphaned-copies", env=env),
        "praesto-hooks",
        "--release-orphaned-copies",
        *words,
    )


def test_the_releaser_child_writes_to_the_hooks_log(tmp_path: Path) -> None:
    """The child gunicorn's master starts inherits its stderr: a refusal it prints at run time (here, no
    Kubernetes client configuration) reaches the hooks' own log."""
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    log = tmp_path / "hooks.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BIN / "praesto-hooks"), "--release-orphaned-copies", f"--bind=127.0.0.1:{port}", "--workers=1"],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(tmp_path / "missing.kubeconfig")},
        )  # fmt: skip
    try:
        end = time.monotonic() + DEADLINE
        while "praesto-orphans: error: no Kubernetes client configuration" not in log.read_text():
            assert process.poll() is None, f"praesto-hooks ended ({process.returncode}):\n{log.read_text()}"
            assert time.monotonic() < end, (
                f"the releaser's refusal never reached the hooks' log:\n{log.read_text()}"
            )
            time.sleep(0.05)  # poll interval, bounded by the deadline above
    finally:
        process.terminate()
        process.wait(timeout=DEADLINE)
