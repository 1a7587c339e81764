"""NodePublishVolume / NodeUnpublishVolume with real bind mounts: read-only, idempotent, recorded."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import grpc
import pytest
from praesto.csi import mounts
from praesto.csi.storefs import CsiStore

from praesto import names, store
from testkit.csi_driver import NEEDS_ROOT, InProcessDriver, make_cache, publish_request, rpc_error

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)


def target_in(pods: Path, uid: str = "u1") -> str:
    return str(pods / uid / "volumes" / "kubernetes.io~csi" / "model" / "mount")


def test_publish_mounts_read_only_and_records(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "default", "tinyllama")
    target = target_in(pods)
    os.makedirs(os.path.dirname(target))
    driver.client.publish(publish_request("csi-1", target))

    (entry,) = mounts.mounts_at(mounts.read_mountinfo(), target)
    assert entry.read_only and {"nosuid", "nodev"} <= set(entry.options)
    assert Path(target, "model.safetensors").read_text() == "weights"
    with pytest.raises(OSError) as caught:
        Path(target, "new-file").write_text("x")
    assert caught.value.errno == errno.EROFS
    with pytest.raises(OSError) as caught:
        Path(target, "model.safetensors").write_text("tampered")
    assert caught.value.errno == errno.EROFS
    # the cache itself stays writable for the agent: only the Pod's view is read-only
    assert os.access(driver.layout.cache_dir("default", "tinyllama"), os.W_OK)

    record = CsiStore(driver.layout).find_mount("csi-1")
    assert record is not None
    assert (record.namespace, record.name, record.target_path) == ("default", "tinyllama", target)
    assert store.mounts_for(driver.layout, "default", "tinyllama") == [record]


def test_publish_twice_is_ok_and_mounts_once(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "default", "tinyllama")
    target = target_in(pods)
    request = publish_request("csi-1", target)
    driver.client.publish(request)
    driver.client.publish(request)
    assert len(mounts.mounts_at(mounts.read_mountinfo(), target)) == 1
    assert len(store.all_mounts(driver.layout)) == 1


def test_other_volume_at_same_target_is_already_exists(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "default", "tinyllama")
    make_cache(driver.layout, "default", "bert")
    target = target_in(pods)
    driver.client.publish(publish_request("csi-1", target))
    for request in (publish_request("csi-2", target), publish_request("csi-1", target, cache="bert")):
        err = rpc_error(lambda request=request: driver.client.publish(request))
        assert err.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "target_path" in (err.details() or "")
    assert len(mounts.mounts_at(mounts.read_mountinfo(), target)) == 1


def test_unpublish_unmounts_removes_target_and_stamps_last_used(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "default", "tinyllama")
    target = target_in(pods)
    driver.client.publish(publish_request("csi-1", target))
    assert store.last_used(driver.layout, "default", "tinyllama") is None

    driver.client.unpublish("csi-1", target)
    assert mounts.mounts_at(mounts.read_mountinfo(), target) == []
    assert not os.path.exists(target)
    assert CsiStore(driver.layout).find_mount("csi-1") is None
    assert store.last_used(driver.layout, "default", "tinyllama") is not None
    assert Path(driver.layout.cache_dir("default", "tinyllama"), "model.safetensors").exists()

    driver.client.unpublish("csi-1", target)  # again: the kubelet retries
    driver.client.unpublish("never-published", target_in(pods, "u9"))


def test_republish_after_unpublish(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "default", "tinyllama")
    target = target_in(pods)
    for _ in range(3):
        driver.client.publish(publish_request("csi-1", target))
        driver.client.unpublish("csi-1", target)
    assert mounts.mounts_at(mounts.read_mountinfo(), target) == []
    assert store.all_mounts(driver.layout) == []


@pytest.mark.parametrize(
    ("request_kwargs", "field"),
    [
        ({"volume_id": ""}, "volume_id"),
        ({"target": "relative/path"}, "target_path"),
        ({"target": "/pods/../etc"}, "target_path"),
        ({"readonly": False}, "readonly"),
        ({"access_type": "block"}, "volume_capability"),
        ({"access_type": "none"}, "volume_capability"),
        ({"cache": ""}, names.CSI_ATTR_CACHE_NAME),
        ({"cache": "Not_A_Name"}, names.CSI_ATTR_CACHE_NAME),
        ({"namespace": None}, "podInfoOnMount: true"),
    ],
)
def test_invalid_requests_name_the_field(
    driver: InProcessDriver, pods: Path, request_kwargs: dict[str, object], field: str
) -> None:
    make_cache(driver.layout, "default", "tinyllama")
    kwargs: dict[str, object] = {"volume_id": "csi-1", "target": target_in(pods)}
    kwargs.update(request_kwargs)
    request = publish_request(**kwargs)  # type: ignore[arg-type]
    if request_kwargs.get("access_type") == "none":
        request.ClearField("volume_capability")
    err = rpc_error(lambda: driver.client.publish(request))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.details() or "")
    assert mounts_below(pods) == []


def mounts_below(path: Path) -> list[mounts.MountInfo]:
    return [e for e in mounts.read_mountinfo() if mounts.is_within(e.mount_point, str(path))]


def test_unpublish_validates_its_fields(driver: InProcessDriver) -> None:
    err = rpc_error(lambda: driver.client.unpublish("", "/x"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "volume_id" in (err.details() or "")
    err = rpc_error(lambda: driver.client.unpublish("csi-1", "x"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "target_path" in (err.details() or "")
