"""A crashed and restarted praesto-csi: stale socket, mount records rebuilt, unpublish still works."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.csi import mounts
from praesto.csi.proto import csi_pb2
from praesto.csi.recovery import recovered_volume_id
from praesto.csi.storefs import CsiStore

from praesto import names, store
from testkit.csi_driver import NEEDS_ROOT, cli_driver, make_cache, publish_request, short_socket_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)


@pytest.fixture
def socket_path() -> Iterator[Path]:
    directory = short_socket_dir()
    yield directory / "csi.sock"
    shutil.rmtree(directory, ignore_errors=True)


def test_restart_rebuilds_records_and_unpublishes(base: Path, pods: Path, socket_path: Path) -> None:
    layout = store.StoreLayout(base)
    make_cache(layout, "default", "tinyllama")
    make_cache(layout, "team-b", "bert")
    kept, unrecorded, vanished = str(pods / "a"), str(pods / "b"), str(pods / "c")

    with cli_driver(base, socket_path) as first:
        first.client.publish(publish_request("csi-a", kept))
        first.client.publish(publish_request("csi-b", unrecorded, "bert", "team-b"))
        first.client.publish(publish_request("csi-c", vanished))
        first.kill()
    assert socket_path.is_socket()  # a crash leaves the socket file behind
    # a crash between mount and record, and a mount removed behind the driver's back:
    CsiStore(layout).drop_mount("csi-b")
    mounts.unmount(vanished)
    assert store.last_used(layout, "default", "tinyllama") is None

    with cli_driver(base, socket_path) as second:
        by_target = {r.target_path: r for r in store.all_mounts(layout)}
        assert set(by_target) == {kept, unrecorded}
        assert by_target[kept].volume_id == "csi-a"
        assert by_target[unrecorded].volume_id == recovered_volume_id(unrecorded)
        assert (by_target[unrecorded].namespace, by_target[unrecorded].name) == ("team-b", "bert")
        assert store.last_used(layout, "default", "tinyllama") is not None  # the vanished mount's record

        # the kubelet, unaware of the crash, unpublishes with the ids it knows
        second.client.unpublish("csi-b", unrecorded)
        second.client.unpublish("csi-a", kept)
        second.client.unpublish("csi-c", vanished)
        assert second.client.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True
        assert store.all_mounts(layout) == []
        assert [e for e in mounts.read_mountinfo() if mounts.is_within(e.mount_point, str(pods))] == []
        assert not any(Path(t).exists() for t in (kept, unrecorded, vanished))
        assert second.terminate() == 0  # SIGTERM: graceful stop
    assert not socket_path.exists()


def test_a_mount_of_a_retired_revision_keeps_its_bytes_and_its_record_names_the_commit(
    base: Path, pods: Path, socket_path: Path
) -> None:
    """A rolling update renames the served copy into `retired` (agent/rolling.py): the Pod's mount
    keeps reading the old bytes, its record names the old commit, and a restarted driver adopts
    the mount as this cache's with that commit (else the agent would remove the copy under it)."""
    layout = store.StoreLayout(base)
    old, new = "a" * 40, "b" * 40
    cache = make_cache(layout, "default", "tinyllama", content="old weights")
    (cache / names.MANIFEST_FILE).write_text(json.dumps({"resolvedRevision": old}))
    running, after = str(pods / "running"), str(pods / "after")
    with cli_driver(base, socket_path) as first:
        first.client.publish(publish_request("csi-old", running))
        assert CsiStore(layout).find_mount("csi-old").revision == old  # type: ignore[union-attr]
        retired = layout.retired_dir("default", "tinyllama", old)
        retired.parent.mkdir(parents=True)
        os.rename(cache, retired)  # the switch, as the agent does it
        fresh = make_cache(layout, "default", "tinyllama", content="new weights")
        (fresh / names.MANIFEST_FILE).write_text(json.dumps({"resolvedRevision": new}))
        first.client.publish(publish_request("csi-new", after))
        assert CsiStore(layout).find_mount("csi-new").revision == new  # type: ignore[union-attr]
        assert (Path(running) / "model.safetensors").read_text() == "old weights"
        assert (Path(after) / "model.safetensors").read_text() == "new weights"
        first.kill()
    CsiStore(layout).drop_mount("csi-old")  # a crash lost the record
    with cli_driver(base, socket_path) as second:
        by_target = {r.target_path: r for r in store.all_mounts(layout)}
        adopted = by_target[running]
        assert (adopted.namespace, adopted.name, adopted.revision) == ("default", "tinyllama", old)
        assert by_target[after].revision == new
        second.client.unpublish(adopted.volume_id, running)
        second.client.unpublish("csi-new", after)
        assert store.all_mounts(layout) == []
