"""The root CSI driver never writes, deletes or reads through what the agent can plant under `.praesto`.

Issue #12 (8): the node agent (uid 65532) writes the same tree as the root CSI
container. A symlink it plants at `.praesto/mounts`, `.praesto/requests` or
`.praesto/used/<cache>` used to send root's writes (and unlinks) anywhere on the
node; a planted progress file could make the driver read any file into a Pod's
events. Real filesystem, real gRPC, as root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from praesto.csi import mounts
from praesto.csi.storefs import CsiStore

from praesto import names, store
from testkit.csi_driver import NEEDS_ROOT, InProcessDriver, make_cache, publish_request, rpc_error

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)
AGENT_UID = 65532


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory the agent must not be able to make root write into."""
    path = tmp_path / "host-etc"
    path.mkdir()
    return path


def no_mounts_below(path: Path) -> bool:
    return not [e for e in mounts.read_mountinfo() if mounts.is_within(e.mount_point, str(path))]


def test_a_symlinked_mounts_dir_gets_no_record_and_no_mount(
    driver: InProcessDriver, pods: Path, outside: Path
) -> None:
    make_cache(driver.layout, "team-a", "llm")
    driver.layout.internal.mkdir(exist_ok=True)
    driver.layout.mounts_dir.symlink_to(outside)  # planted by the agent
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"), "llm", "team-a")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert str(driver.layout.mounts_dir) in (err.details() or "") and "symbolic link" in (err.details() or "")
    assert list(outside.iterdir()) == []
    assert no_mounts_below(pods)


def test_unpublish_never_deletes_through_a_symlinked_mounts_dir(
    driver: InProcessDriver, pods: Path, outside: Path
) -> None:
    victim = outside / (names.short_hash("csi-1", 32) + ".json")  # the name root would unlink
    victim.write_text("{}")
    driver.layout.internal.mkdir(exist_ok=True)
    driver.layout.mounts_dir.symlink_to(outside)
    rpc_error(lambda: driver.client.unpublish("csi-1", str(pods / "t")))
    assert victim.exists()


def test_a_symlinked_requests_dir_gets_no_request(driver: InProcessDriver, pods: Path, outside: Path) -> None:
    driver.layout.internal.mkdir(exist_ok=True)
    driver.layout.requests_dir.symlink_to(outside)
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"), "llm", "team-a")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert list(outside.iterdir()) == []


def test_a_planted_used_stamp_symlink_is_replaced_not_followed(
    driver: InProcessDriver, pods: Path, outside: Path
) -> None:
    make_cache(driver.layout, "team-a", "llm")
    target = pods / "t"
    driver.client.publish(publish_request("csi-1", str(target), "llm", "team-a"))
    driver.client.unpublish("csi-1", str(target))  # the first unmount stamps the cache's last use
    precious = outside / "shadow"
    precious.write_text("root:secret")
    os.utime(precious, (1_000_000, 1_000_000))
    stamp = driver.layout.used_dir / store.cache_key("team-a", "llm")
    stamp.unlink()
    stamp.symlink_to(precious)  # the agent may write in used/ (it removes stamps of deleted caches)
    driver.client.publish(publish_request("csi-2", str(target), "llm", "team-a"))
    driver.client.unpublish("csi-2", str(target))
    assert precious.read_text() == "root:secret" and precious.stat().st_mtime == 1_000_000
    assert not stamp.is_symlink() and stamp.is_file()
    assert store.last_used(driver.layout, "team-a", "llm") is not None


def test_a_directory_the_agent_swapped_in_is_refused(driver: InProcessDriver, pods: Path) -> None:
    driver.layout.internal.mkdir(exist_ok=True)
    driver.layout.requests_dir.mkdir()
    os.chown(driver.layout.requests_dir, AGENT_UID, 0)  # its own directory, where it could plant anything
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"), "llm", "team-a")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"owned by uid {AGENT_UID}" in (err.details() or "")
    assert list(driver.layout.requests_dir.iterdir()) == []


def test_a_planted_progress_file_is_not_read_into_pod_events(
    driver: InProcessDriver, pods: Path, outside: Path
) -> None:
    secret = outside / "secret.json"
    secret.write_text(json.dumps({"phase": "Failed", "message": "TOP-SECRET-VALUE"}))
    driver.layout.progress_dir.mkdir(parents=True)
    (driver.layout.progress_dir / (store.cache_key("team-a", "llm") + ".json")).symlink_to(secret)
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"), "llm", "team-a")))
    assert "TOP-SECRET-VALUE" not in (err.details() or "")
    assert err.code() == grpc.StatusCode.UNAVAILABLE  # no progress yet: waiting for the agent


@pytest.fixture
def node_base() -> Iterator[Path]:
    """A base path the way the chart expects it: root-owned 0775, reachable by the agent's uid."""
    parent = Path(tempfile.mkdtemp(prefix="praesto-base-", dir="/tmp"))
    os.chmod(parent, 0o755)
    base = parent / "store"
    base.mkdir(mode=0o775)
    os.chmod(base, 0o775)
    try:
        yield base
    finally:
        shutil.rmtree(parent, ignore_errors=True)


AS_AGENT = """
import os, sys
from pathlib import Path
from praesto import store
layout = store.StoreLayout(Path(sys.argv[1]))
os.setgroups([]); os.setgid(0); os.setuid({uid})  # the agent's identity in the chart
store.clear_hydration_request(layout, "team-a", "llm")  # answered: the agent removes it
(layout.used_dir / store.cache_key("team-a", "llm")).unlink()  # deleted cache: its stamp goes
try:
    (layout.mounts_dir / "planted.json").symlink_to("/etc/passwd")
except PermissionError:
    print("mounts: denied")
"""


def test_the_agent_can_clear_what_it_must_and_plant_nothing_in_mount_records(node_base: Path) -> None:
    fs = CsiStore(store.StoreLayout(node_base))
    fs.request_hydration("team-a", "llm")
    fs.touch_used("team-a", "llm")
    fs.record_mount(store.MountRecord("csi-1", "team-a", "llm", "/var/lib/kubelet/pods/p/v", 1.0))
    layout = fs.layout
    for sub, mode in (("mounts", 0o755), ("used", 0o2775), ("requests", 0o2775)):
        st = (layout.internal / sub).stat()
        assert (st.st_uid, st.st_mode & 0o7777) == (0, mode), sub
    code = AS_AGENT.format(uid=AGENT_UID)
    done = subprocess.run(
        [sys.executable, "-c", code, str(node_base)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "mounts: denied"
    assert store.pending_hydration_requests(layout) == []
    assert store.last_used(layout, "team-a", "llm") is None
    assert [r.volume_id for r in fs.all_mounts()] == ["csi-1"]


def test_the_driver_refuses_to_start_on_a_tampered_store(base: Path, outside: Path) -> None:
    layout = store.StoreLayout(base)
    layout.internal.mkdir()
    layout.mounts_dir.symlink_to(outside)
    sockets = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
    try:
        argv = [sys.executable, "-m", "praesto.csi.cli", "--base-path", str(base), "--node-name", "n1",
                "--endpoint", f"unix://{sockets}/csi.sock"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    assert done.returncode == 1, done.stderr
    assert str(layout.mounts_dir) in done.stderr and "remove it" in done.stderr
    assert list(outside.iterdir()) == []
