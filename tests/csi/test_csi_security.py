"""A Pod sees only its own namespace's caches: forged namespaces, traversal and symlinks are refused."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest
from praesto.csi import mounts

from praesto import names, store
from testkit.csi_driver import NEEDS_ROOT, InProcessDriver, make_cache, publish_request, rpc_error

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)


def no_mounts_below(path: Path) -> bool:
    return not [e for e in mounts.read_mountinfo() if mounts.is_within(e.mount_point, str(path))]


def test_legacy_namespace_differing_from_pod_namespace_is_permission_denied(
    driver: InProcessDriver, pods: Path
) -> None:
    make_cache(driver.layout, "team-b", "llm")
    request = publish_request(
        "csi-1",
        str(pods / "t"),
        cache="llm",
        namespace="team-a",
        extra={names.CSI_ATTR_LEGACY_NAMESPACE: "team-b"},
    )
    err = rpc_error(lambda: driver.client.publish(request))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert names.CSI_ATTR_LEGACY_NAMESPACE in (err.details() or "")
    assert no_mounts_below(pods) and store.all_mounts(driver.layout) == []


def test_legacy_namespace_equal_to_pod_namespace_is_accepted(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "team-a", "llm")
    request = publish_request(
        "csi-1",
        str(pods / "t"),
        cache="llm",
        namespace="team-a",
        extra={names.CSI_ATTR_LEGACY_NAMESPACE: "team-a"},
    )
    driver.client.publish(request)
    assert Path(pods / "t" / "config.json").exists()


def test_namespace_comes_only_from_pod_info(driver: InProcessDriver, pods: Path) -> None:
    """A cache that exists only in another namespace is not found; the agent is asked for the Pod's own."""
    make_cache(driver.layout, "team-b", "llm")
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"), "llm", "team-a")))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "team-a/llm" in (err.details() or "")
    assert store.pending_hydration_requests(driver.layout) == [("team-a", "llm")]
    assert no_mounts_below(pods)


@pytest.mark.parametrize("cache", ["..", "../team-b", "llm/../../team-b/llm", ".praesto", "a/b"])
def test_traversal_in_cache_name_is_invalid(driver: InProcessDriver, pods: Path, cache: str) -> None:
    make_cache(driver.layout, "team-b", "llm")
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"), cache, "team-a")))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert no_mounts_below(pods)


@pytest.mark.parametrize("namespace", ["..", ".praesto", "team-a/../team-b"])
def test_traversal_in_pod_namespace_is_invalid(driver: InProcessDriver, pods: Path, namespace: str) -> None:
    err = rpc_error(
        lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"), "llm", namespace))
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_symlinked_cache_dir_to_other_namespace_is_refused(driver: InProcessDriver, pods: Path) -> None:
    other = make_cache(driver.layout, "team-b", "llm")
    (driver.layout.base / "team-a").mkdir()
    driver.layout.cache_dir("team-a", "llm").symlink_to(other)  # inside the base, wrong namespace
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"), "llm", "team-a")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "team-a/llm" in (err.details() or "")
    assert no_mounts_below(pods) and store.all_mounts(driver.layout) == []


def test_symlinked_namespace_dir_escaping_the_store_is_refused(
    driver: InProcessDriver, pods: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "host-secrets"
    (outside / "llm").mkdir(parents=True)
    (outside / "llm" / names.COMPLETE_FILE).write_text("")
    (driver.layout.base / "team-a").symlink_to(outside)
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", str(pods / "t"), "llm", "team-a")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert no_mounts_below(pods)


def test_target_inside_the_store_is_refused(driver: InProcessDriver) -> None:
    make_cache(driver.layout, "team-a", "llm")
    target = str(driver.layout.base / "team-b" / "llm")
    err = rpc_error(lambda: driver.client.publish(publish_request("csi-1", target, "llm", "team-a")))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not os.path.exists(target)
