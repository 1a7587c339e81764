"""The node tier's Praesto image (testkit/praesto_image.py) runs what the download Job runs.

No kubelet here: `chroot` stands in for the container runtime. The image's root
filesystem is unpacked and bind-mounted read-only (readOnlyRootFilesystem), with
writable mounts where the Job has volumes (/tmp, /cache) and the termination log, and
every command runs as uid/gid 65532 with the image's Env under the container's, as the
Job's Pod does. The node tier then runs the same archive on a real kubelet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc_job import download_job
from praesto.hooks.pvc_pod import TERMINATION_LOG

from praesto.spec import parse_spec
from testkit.dockerfile import image_env
from testkit.egress import LOOPBACK_ENV
from testkit.helm_chart import ROOT
from testkit.hook_objects import modelcache
from testkit.hub import LocalHub
from testkit.oci_archive import extract_rootfs, read_image
from testkit.praesto_image import NONROOT, PRAESTO_IMAGE, VENV, PraestoImage, praesto_image

NEEDS_ROOT = "needs root: chroot, bind mounts and running as uid 65532"
CONSOLE_SCRIPTS = ("praesto", "praesto-agent", "praesto-hooks", "praesto-csi")
STEP_TIMEOUT = 120.0
NODE_BINARIES = ROOT / "build" / "cluster" / "node"  # scripts/build_cluster.sh tests/node links it here
MODEL = {
    "config.json": b'{"model_type": "test"}',
    "tokenizer/vocab.txt": b"token\n" * 100,
    "model.safetensors": bytes(range(256)) * 64,  # over the hub's LFS threshold: served by its "CDN"
}


@pytest.fixture(scope="module")
def image() -> PraestoImage:
    return praesto_image()


@pytest.fixture(scope="module")
def rootfs(image: PraestoImage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.geteuid() != 0:
        pytest.skip(NEEDS_ROOT)
    return extract_rootfs(image.archive, tmp_path_factory.mktemp("praesto-rootfs"))


def test_the_config_is_the_dockerfiles_runtime_stage(image: PraestoImage) -> None:
    config = read_image(image.archive)[0]["config"]
    env = dict(entry.split("=", 1) for entry in config["Env"])
    assert config["User"] == f"{NONROOT}:{NONROOT}"
    assert env["PATH"].startswith(f"{VENV}/bin:")
    assert env["HOME"] == "/tmp" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["MALLOC_ARENA_MAX"] == "2"  # the agent's download threads share arenas (xetmemory.py)
    assert image_env().items() <= env.items()  # what the tiers give the processes they start
    assert config["Cmd"] == ["praesto-hooks"] and config["WorkingDir"] == "/tmp"


def test_the_layer_holds_the_scripts_and_leaves_out_what_no_process_runs(image: PraestoImage) -> None:
    layer_name = read_image(image.archive)[1]
    with tarfile.open(image.archive) as outer:
        layer = outer.extractfile(layer_name)
        assert layer is not None
        with tarfile.open(fileobj=layer, mode="r|") as tar:
            members = {m.name: m for m in tar}
    for script in CONSOLE_SCRIPTS:
        assert members[f"opt/praesto/bin/{script}"].mode & 0o755 == 0o755
    assert members["tmp"].mode == 0o1777
    assert all(m.uid == 0 and not m.mode & 0o022 for m in members.values() if m.isfile())
    parts = {part for name in members for part in name.split("/")}
    assert not parts & {"test", "idlelib", "tkinter", "ensurepip"}
    assert not [n for n in members if n.endswith(".pyc") and ".opt-" in n]


def test_a_second_call_reuses_the_cached_archive(image: PraestoImage) -> None:
    built = image.archive.stat().st_mtime_ns
    praesto_image.cache_clear()
    again = praesto_image()
    assert again.archive == image.archive and again.archive.stat().st_mtime_ns == built


@contextmanager
def read_only_root(rootfs: Path, volumes: dict[str, Path]) -> Iterator[Path]:
    """`rootfs` mounted read-only with each of `volumes` (path in the image -> host dir or file) writable."""
    for path, host in volumes.items():
        target = rootfs / path.lstrip("/")
        if host.is_dir():
            target.mkdir(
                exist_ok=True
            )  # the runtime makes volume mount points as root, before going read-only
        else:
            target.touch()
    mounted: list[Path] = []
    try:
        subprocess.run(["mount", "--bind", rootfs, rootfs], check=True)
        mounted.append(rootfs)
        subprocess.run(["mount", "-o", "remount,bind,ro", rootfs], check=True)
        for path, host in volumes.items():
            subprocess.run(["mount", "--bind", host, rootfs / path.lstrip("/")], check=True)
            mounted.append(rootfs / path.lstrip("/"))
        yield rootfs
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", target], check=True)


def run_as_nonroot(
    rootfs: Path, image: PraestoImage, argv: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`argv` inside the image as uid/gid 65532, with the image's Env (then `env` over it) and nothing else."""
    image_env = dict(entry.split("=", 1) for entry in image.config.env)
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    return subprocess.run(
        [chroot, f"--userspec={NONROOT}:{NONROOT}", str(rootfs), *argv],
        env={**image_env, **(env or {})},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        check=False,
    )


def test_console_scripts_start_as_nonroot_on_a_read_only_root(
    rootfs: Path, image: PraestoImage, tmp_path: Path
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o1777)
    tmp.chmod(0o1777)
    with read_only_root(rootfs, {"/tmp": tmp}) as root:
        agent = run_as_nonroot(root, image, ["praesto-agent", "--help"])
        assert agent.returncode == 0 and "usage: praesto-agent" in agent.stdout, agent.stderr
        download = run_as_nonroot(root, image, ["praesto-agent", "download", "--help"])
        assert download.returncode == 0 and "--dest" in download.stdout, download.stderr
        imports = (
            "import praesto.agent.cli, praesto.hooks.serving.server, praesto.csi.cli, sys; print(sys.prefix)"
        )
        python = run_as_nonroot(root, image, ["python", "-c", imports])
        assert python.returncode == 0 and python.stdout.strip() == VENV, python.stderr
        write = run_as_nonroot(root, image, ["python", "-c", f"open('{VENV}/x', 'w')"])
        assert write.returncode != 0 and "Read-only file system" in write.stderr


def _job_container(hub: LocalHub) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, container) of the Job the sync hook makes for a shared-PVC cache of `org/model`."""
    spec = {"source": {"uri": "hf://org/model"}, "storage": {"size": "1Gi", "storageClassName": "rwx"}}
    parent = modelcache("llm", spec=spec, namespace="team-a")
    # The chart hands downloads.egress.allowedCIDRs to the Job as downloader env: the hub is on loopback.
    config = HooksConfig(
        downloader_image=PRAESTO_IMAGE, hf_endpoint=hub.endpoint, downloader_env=dict(LOOPBACK_ENV)
    )
    pod: dict[str, Any] = download_job(parent, parse_spec(parent["spec"]), config)["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def test_the_download_jobs_command_fills_the_cache_as_its_pod_runs_it(
    rootfs: Path, image: PraestoImage, tmp_path: Path
) -> None:
    with LocalHub(tmp_path / "hub") as hub:
        commit = hub.add_repo("org/model", MODEL)
        pod, container = _job_container(hub)
        assert pod["securityContext"]["runAsUser"] == NONROOT == pod["securityContext"]["fsGroup"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        cache, tmp, log = tmp_path / "cache", tmp_path / "tmp", tmp_path / "termination-log"
        cache.mkdir()
        os.chown(cache, 0, NONROOT)  # the kubelet gives an fsGroup volume to that group, setgid
        cache.chmod(0o2775)
        tmp.mkdir()
        tmp.chmod(0o777)  # an emptyDir
        log.touch()
        log.chmod(0o666)  # as the kubelet makes a container's termination log
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        volumes = {"/cache": cache, "/tmp": tmp, TERMINATION_LOG: log}
        with read_only_root(rootfs, volumes) as root:
            done = run_as_nonroot(root, image, [*container["command"], *container["args"]], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {str(p.relative_to(cache)): p.read_bytes() for p in cache.rglob("*") if p.is_file()
            and not p.name.startswith(".praesto")} == MODEL  # fmt: skip
    assert (cache / ".praesto-complete").is_file()
    assert all(p.stat().st_uid == NONROOT for p in cache.rglob("*"))
    assert commit in log.read_text()


def test_containerd_imports_the_archive_and_its_snapshot_runs(image: PraestoImage, tmp_path: Path) -> None:
    """What the node tier does with the archive: `ctr images import` into a containerd configured as
    the tier configures it (started here for this test alone), then the unpacked snapshot runs."""
    if os.geteuid() != 0:
        pytest.skip(NEEDS_ROOT)
    if not all((NODE_BINARIES / name).is_file() for name in ("containerd", "ctr")):
        pytest.skip(f"the node tier's containerd is not built in {NODE_BINARIES} (make node-bin)")
    from testkit.node_images import PAUSE_IMAGE  # the node tier's own modules, only when it is built
    from testkit.node_runtime import Containerd

    # A short directory: containerd's sockets live in its workdir, and a unix socket's path may not
    # pass 104 bytes (pytest's tmp_path under xdist, /tmp/pytest-of-root/pytest-NNN/popen-gwN/..., did).
    workdir = Path(tempfile.mkdtemp(prefix="ctr-"))
    containerd = Containerd(NODE_BINARIES, workdir / "containerd", PAUSE_IMAGE)
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    containerd.start()
    try:
        containerd.import_image(image.archive)
        assert PRAESTO_IMAGE in containerd.ctr("images", "ls", "-q").stdout.split()
        containerd.ctr("images", "mount", "--snapshotter=overlayfs", PRAESTO_IMAGE, str(snapshot))
        try:
            agent = run_as_nonroot(snapshot, image, ["praesto-agent", "--help"])
            assert agent.returncode == 0 and "usage: praesto-agent" in agent.stdout, agent.stderr
        finally:
            containerd.ctr("images", "unmount", str(snapshot))
            # The mount's lease, removed with a synchronous GC: `unmount --rm` leaves the mount manager's
            # own mount of the view behind until a later collection (containerd v2.4.2 ctr images mount).
            containerd.ctr("leases", "rm", "--sync", str(snapshot))
    finally:
        containerd.stop()
    mounts = Path("/proc/self/mountinfo").read_text()
    assert f" {tmp_path}/" not in mounts and f" {workdir}/" not in mounts
    shutil.rmtree(workdir)
