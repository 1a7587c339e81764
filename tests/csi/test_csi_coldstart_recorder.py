"""Per-Pod cold-start records: the CSI driver notes a Pod's first attempt, hit or miss, and its mount.

Real gRPC on a unix socket and real bind mounts (root). The record is read back
through `praesto.coldstart_record`, the same parser the node agent uses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest

from praesto import coldstart_record, names, store
from testkit.csi_driver import NEEDS_ROOT, InProcessDriver, make_cache, publish_request, rpc_error

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)
UID = "0b6a2d4e-1111-2222-3333-444455556666"  # what testkit.csi_driver.publish_request sends


def records(layout: store.StoreLayout) -> list[coldstart_record.PodStart]:
    found = sorted(layout.pod_starts_dir.glob("*.json")) if layout.pod_starts_dir.is_dir() else []
    parsed = [coldstart_record.from_json(store.read_json(p)) for p in found]
    assert None not in parsed
    return [r for r in parsed if r is not None]


def test_first_attempt_on_a_ready_cache_is_a_hit(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "team-a", "llm")
    request = publish_request("csi-1", str(pods / "t"), "llm", "team-a")
    driver.client.publish(request)
    (record,) = records(driver.layout)
    assert (record.pod_uid, record.pod_name, record.namespace, record.name) == (UID, "app-0", "team-a", "llm")
    assert record.hit and record.mounted_at is not None
    assert 0 <= record.wait_seconds < 5
    assert record.file_name == coldstart_record.record_name(UID, "team-a", "llm")
    driver.client.publish(request)  # the kubelet's idempotent retry is not a second start
    assert records(driver.layout) == [record]
    # the agent (the base path's group) may remove reported records
    assert os.stat(driver.layout.pod_starts_dir).st_mode & 0o2070 == 0o2070


def test_a_miss_keeps_its_first_attempt_until_the_mount(driver: InProcessDriver, pods: Path) -> None:
    request = publish_request("csi-1", str(pods / "t"), "llm", "team-a")
    assert rpc_error(lambda: driver.client.publish(request)).code() == grpc.StatusCode.UNAVAILABLE
    (waiting,) = records(driver.layout)
    assert not waiting.hit and waiting.mounted_at is None
    make_cache(driver.layout, "team-a", "llm", complete=False)
    assert rpc_error(lambda: driver.client.publish(request)).code() == grpc.StatusCode.UNAVAILABLE
    assert records(driver.layout) == [waiting]  # a retry does not move the first attempt
    make_cache(driver.layout, "team-a", "llm")
    driver.client.publish(request)
    (done,) = records(driver.layout)
    assert not done.hit and done.first_attempt_at == waiting.first_attempt_at
    assert done.mounted_at is not None and done.wait_seconds == done.mounted_at - waiting.first_attempt_at > 0
    assert (pods / "t" / "config.json").is_file()


def test_each_pod_and_cache_has_its_own_record(driver: InProcessDriver, pods: Path) -> None:
    make_cache(driver.layout, "team-a", "llm")
    make_cache(driver.layout, "team-a", "embed")
    other = {names.CSI_ATTR_POD_NAME: "app-1", names.CSI_ATTR_POD_UID: UID.replace("0b6a", "9f9f")}
    driver.client.publish(publish_request("csi-1", str(pods / "a"), "llm", "team-a"))
    driver.client.publish(publish_request("csi-2", str(pods / "b"), "embed", "team-a"))
    driver.client.publish(publish_request("csi-3", str(pods / "c"), "llm", "team-a", extra=other))
    got = {(r.pod_name, r.name) for r in records(driver.layout)}
    assert got == {("app-0", "llm"), ("app-0", "embed"), ("app-1", "llm")}


@pytest.mark.parametrize(
    "pod_info",
    [
        {names.CSI_ATTR_POD_UID: ""},
        {names.CSI_ATTR_POD_UID: "../../etc/passwd"},
        {names.CSI_ATTR_POD_NAME: "Not_A_Pod"},
    ],
)
def test_without_valid_pod_info_the_mount_still_works_unrecorded(
    driver: InProcessDriver, pods: Path, pod_info: dict[str, str]
) -> None:
    make_cache(driver.layout, "team-a", "llm")
    driver.client.publish(publish_request("csi-1", str(pods / "t"), "llm", "team-a", extra=pod_info))
    assert (pods / "t" / "config.json").is_file()
    assert records(driver.layout) == []


def test_a_planted_symlink_gets_no_write_and_does_not_stop_the_mount(
    driver: InProcessDriver, pods: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "host-etc"
    outside.mkdir()
    make_cache(driver.layout, "team-a", "llm")
    driver.layout.internal.mkdir(exist_ok=True)
    driver.layout.pod_starts_dir.symlink_to(outside)  # planted by the agent
    driver.client.publish(publish_request("csi-1", str(pods / "t"), "llm", "team-a"))
    assert (pods / "t" / "config.json").is_file()
    assert list(outside.iterdir()) == []


def test_a_planted_record_symlink_is_replaced_not_followed(
    driver: InProcessDriver, pods: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.json"
    victim.write_text(json.dumps({"keep": True}))
    make_cache(driver.layout, "team-a", "llm")
    # let the driver create its directory, then plant a symlink where this Pod's record goes
    driver.client.publish(publish_request("csi-1", str(pods / "a"), "llm", "team-a"))
    for path in driver.layout.pod_starts_dir.iterdir():
        path.unlink()
    (driver.layout.pod_starts_dir / coldstart_record.record_name(UID, "team-a", "llm")).symlink_to(victim)
    driver.client.publish(publish_request("csi-2", str(pods / "b"), "llm", "team-a"))
    assert json.loads(victim.read_text()) == {"keep": True}
    (record,) = records(driver.layout)
    assert record.hit
