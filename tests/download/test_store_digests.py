"""The stores' own checksums (multi-tenant finding 3): read, verified, recorded, and the gate for peers.

Against the real emulators: moto (S3 additional checksums, read with a SigV4-signed HEAD
that moto checks against the key), fake-gcs-server (`x-goog-hash`) and Azurite
(`Content-MD5`, checked with its development key). Only SHA-256 lets peers supply a file
(and catches a lying one); MD5 and SHA-1 verify the origin's bytes but keep the file
origin-only, since colliding pairs can be made on purpose (issue 21 item 11), and so does a
CRC, since anyone can forge bytes that match one.
"""

from __future__ import annotations

import dataclasses
import email.message
import hashlib
import io
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig
from praesto.agent.download import DownloadError, Options
from praesto.agent.download.api import PartSources, Plan, RemoteFile, Sink
from praesto.agent.download.digests import ALGORITHMS, StoreDigest, from_base64
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.origins.objstore import storesums
from praesto.agent.download.origins.objstore.creds import GCS_KEY_FILE
from praesto.agent.download.origins.objstore.storesums import _pick

from praesto import names
from testkit import azurite, gcs_emulator
from testkit.egress import LOOPBACK
from testkit.objstore_checks import MiB, source
from testkit.s3server import S3Server
from tests.download.conftest import tree_of
from tests.download.test_objstore_gcs import service_account_key

BUCKET = "digests"
SMALL = os.urandom(3000)
BIG = os.urandom(11 * MiB + 5)  # three 5 MiB multipart parts


class LyingPeer:
    """A peer that serves garbage for every range it is asked, and is blamed once caught."""

    def __init__(self) -> None:
        self.asked: set[str] = set()
        self.blamed: set[str] = set()

    def fetch(self, file: RemoteFile, start: int, end: int, sink: Sink, cancel: threading.Event) -> int:
        if file.path in self.blamed:
            return 0
        self.asked.add(file.path)
        sink(start, memoryview(bytes(end - start)))
        return end - start

    def blame(self, file: RemoteFile) -> bool:
        """As the real peer source: True only when a peer sent bytes of this file (then origin only)."""
        sent = file.path in self.asked and file.path not in self.blamed
        self.blamed.add(file.path)
        return sent


def manifest_entries(dest: Path) -> dict[str, dict[str, object]]:
    manifest = json.loads((dest / names.MANIFEST_FILE).read_text())
    return {f["path"]: f for f in manifest["files"]}


def check_value(name: str, expected: str) -> None:
    running = ALGORITHMS[name].new()
    running.update(memoryview(bytearray(b"1234")))
    running.update(b"56789")
    assert running.hexdigest() == expected


def test_crc_implementations_match_the_published_check_values() -> None:
    """The CRC check values of "123456789" (CRC catalogue), fed as a writable view then bytes."""
    check_value("crc32", "cbf43926")
    check_value("crc32c", "e3069283")
    check_value("crc64nvme", "ae8b14860a799888")


def test_only_a_sha256_store_digest_lets_peers_supply_a_file() -> None:
    md5 = from_base64("md5", "1B2M2Y8AsgTpgAmY7PhCfg==", "Content-MD5")
    assert md5 == StoreDigest("md5", hashlib.md5(b"").hexdigest(), "Content-MD5")
    crc = from_base64("crc32c", "AAAAAA==", "x-goog-hash")
    assert crc is not None and not crc.cryptographic
    assert md5 is not None and md5.cryptographic and not RemoteFile("a", 1, digest=md5).peers_may_supply
    sha256 = StoreDigest("sha256", hashlib.sha256(b"").hexdigest(), "x-amz-checksum-sha256")
    assert RemoteFile("a", 1, digest=sha256).peers_may_supply
    assert not RemoteFile("a", 1, digest=crc).peers_may_supply
    assert not RemoteFile("a", 1).peers_may_supply
    assert from_base64("md5", "not base64!", "Content-MD5") is None
    assert from_base64("sha256", "AAAAAA==", "x-amz-checksum-sha256") is None  # wrong length


def test_a_checksum_for_a_replaced_object_is_not_used() -> None:
    """The HEAD answered for another ETag than the listing's: its checksum is someone else's."""
    headers = email.message.Message()
    headers["ETag"] = '"new"'
    headers["Content-MD5"] = "1B2M2Y8AsgTpgAmY7PhCfg=="
    planned = RemoteFile("a", 0, etag='"old"')
    assert _pick(planned, headers, "az") is planned
    assert _pick(dataclasses.replace(planned, etag='"new"'), headers, "az").digest is not None


def test_a_composite_gcs_object_is_vouched_for_by_its_crc32c_alone() -> None:
    """GCS composes objects without an MD5: the CRC32C verifies the fetch, peers stay out."""
    headers = email.message.Message()
    headers["x-goog-hash"] = "crc32c=JedDng=="
    picked = _pick(RemoteFile("a", 1), headers, "gs")
    assert picked.digest == StoreDigest("crc32c", "25e7439e", "x-goog-hash") and not picked.peers_may_supply


def test_composite_s3_checksums_are_not_taken_for_the_object() -> None:
    full = email.message.Message()
    full["ETag"] = '"b024ccf8d30ecbac5c2f6303af250e16-3"'
    full["x-amz-checksum-type"] = "FULL_OBJECT"
    full["x-amz-checksum-crc32"] = "ikB6kg=="
    assert _pick(RemoteFile("a", 1), full, "s3").digest == StoreDigest(
        "crc32", "8a407a92", "x-amz-checksum-crc32"
    )
    del full["x-amz-checksum-type"]  # a multipart object without a type: not known to be whole
    assert _pick(RemoteFile("a", 1), full, "s3").digest is None
    headers = email.message.Message()
    headers["x-amz-checksum-crc32"] = "ikB6kg==-3"
    assert _pick(RemoteFile("a", 1), headers, "s3").digest is None
    typed = email.message.Message()
    typed["x-amz-checksum-type"] = "COMPOSITE"
    typed["x-amz-checksum-sha256"] = "EZbHvnHg2qv67oPfu0Td5cWrUrfqtf2CgHbAG4y9VJE="
    assert _pick(RemoteFile("a", 1), typed, "s3").digest is None


def fetch_twice(planned: Plan, options: Options, tmp_path: Path) -> tuple[Path, LyingPeer]:
    """Download through a lying peer; return the published tree and what the peer was asked."""
    peer = LyingPeer()
    dest = tmp_path / "dest"
    download(planned, dest, options, PartSources(peers=peer))
    return dest, peer


# ---- S3 (moto) ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with S3Server(tmp_path_factory.mktemp("moto"), auth_actions=3) as server:
        key = server.create_key()
        client = server.client(key)
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="m/sha256.bin", Body=SMALL, ChecksumAlgorithm="SHA256")
        client.put_object(Bucket=BUCKET, Key="m/crc64.bin", Body=SMALL, ChecksumAlgorithm="CRC64NVME")
        client.upload_fileobj(
            io.BytesIO(BIG), BUCKET, "m/multipart.bin",
            Config=TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB),
        )  # fmt: skip
        # As with SSE-KMS: the ETag is no MD5, so only the store's checksums remain.
        yield {
            "AWS_ACCESS_KEY_ID": key[0], "AWS_SECRET_ACCESS_KEY": key[1],
            "AWS_ENDPOINT_URL": server.endpoint, "S3_VERIFY_ETAG_MD5": "0",
        }  # fmt: skip


def test_s3_additional_checksums_are_read_signed_and_verified(s3: dict[str, str], tmp_path: Path) -> None:
    """moto checks SigV4 against the key here (auth_actions): an unsigned HEAD would get no checksum."""
    options = Options(credentials=s3, part_size=1 * MiB, concurrency=4, egress=LOOPBACK)
    planned = plan(source(f"s3://{BUCKET}/m"), options)
    digests = {f.path: f.digest for f in planned.files}
    sha256 = digests["sha256.bin"]
    assert sha256 == StoreDigest("sha256", hashlib.sha256(SMALL).hexdigest(), "x-amz-checksum-sha256")
    crc64, multipart = digests["crc64.bin"], digests["multipart.bin"]
    assert sha256 is not None
    assert crc64 is not None and (crc64.algorithm, crc64.header) == ("crc64nvme", "x-amz-checksum-crc64nvme")
    # moto labels a multipart object's CRC32 with no checksum type: a checksum of checksums, unused
    assert multipart is None

    dest, peer = fetch_twice(planned, options, tmp_path)

    assert tree_of(dest) == {"sha256.bin": SMALL, "crc64.bin": SMALL, "multipart.bin": BIG}
    assert peer.asked == {"sha256.bin"} == peer.blamed  # the lie was caught by S3's SHA-256
    entries = manifest_entries(dest)
    assert entries["sha256.bin"]["verifiedBy"] == "sha256"
    assert entries["crc64.bin"]["verifiedBy"] == "crc64nvme"
    assert entries["multipart.bin"]["verifiedBy"] == "origin-only"
    assert entries["sha256.bin"]["storeDigest"] == {"value": sha256.value, "from": "x-amz-checksum-sha256"}


def test_s3_bytes_that_contradict_the_stores_crc_fail_the_file(s3: dict[str, str], tmp_path: Path) -> None:
    options = Options(credentials=s3, part_size=1 * MiB, concurrency=4, egress=LOOPBACK)
    planned = plan(source(f"s3://{BUCKET}/m/crc64.bin"), options)
    wrong = StoreDigest("crc64nvme", "0" * 16, "x-amz-checksum-crc64nvme")
    planned = dataclasses.replace(
        planned, files=tuple(dataclasses.replace(f, digest=wrong) for f in planned.files)
    )
    with pytest.raises(DownloadError) as info:
        download(planned, tmp_path / "dest", options)
    assert info.value.reason == "ChecksumMismatch"
    assert "expected crc64nvme " + "0" * 16 + " (x-amz-checksum-crc64nvme)" in info.value.message
    assert not (tmp_path / "dest").exists()


# ---- GCS (fake-gcs-server) -----------------------------------------------------------------
@pytest.mark.skipif(gcs_emulator.binary() is None, reason=gcs_emulator.SKIP_REASON)
def test_gcs_md5_from_x_goog_hash_verifies_the_origin_and_keeps_peers_out(tmp_path: Path) -> None:
    with gcs_emulator.GCSEmulator(tmp_path / "gcs") as server:
        server.create_bucket(BUCKET)
        server.upload(BUCKET, "m/weights.bin", BIG)
        server.upload(BUCKET, "m/config.json", SMALL)
        settings = {GCS_KEY_FILE: service_account_key(), "GOOGLE_BASE_URL": server.endpoint}
        options = Options(credentials=settings, part_size=1 * MiB, concurrency=4, egress=LOOPBACK)
        planned = plan(source(f"gs://{BUCKET}/m"), options)
        assert {f.path: f.digest for f in planned.files} == {
            "weights.bin": StoreDigest("md5", hashlib.md5(BIG).hexdigest(), "x-goog-hash"),
            "config.json": StoreDigest("md5", hashlib.md5(SMALL).hexdigest(), "x-goog-hash"),
        }
        dest, peer = fetch_twice(planned, options, tmp_path)
    assert tree_of(dest) == {"weights.bin": BIG, "config.json": SMALL}
    assert peer.asked == peer.blamed == set()  # MD5 can be collided: origin only (item 11)
    assert {p: e["verifiedBy"] for p, e in manifest_entries(dest).items()} == {
        "weights.bin": "md5",
        "config.json": "md5",
    }


# ---- Azure (Azurite) ----------------------------------------------------------------------
@pytest.mark.skipif(azurite.skip_reason() is not None, reason=azurite.skip_reason() or "")
def test_azure_content_md5_when_set_else_origin_only(tmp_path: Path) -> None:
    with azurite.Azurite(tmp_path / "azurite") as server:
        service = server.service()
        service.create_container(BUCKET)
        service.get_blob_client(BUCKET, "m/config.json").upload_blob(SMALL)  # Put Blob: Content-MD5 set
        blocks = service.get_blob_client(BUCKET, "m/weights.bin")  # staged blocks: no Content-MD5
        blocks.stage_block("YmxvY2sx", BIG[: 6 * MiB])
        blocks.stage_block("YmxvY2sy", BIG[6 * MiB :])
        blocks.commit_block_list(["YmxvY2sx", "YmxvY2sy"])
        options = Options(credentials=server.settings(), part_size=1 * MiB, concurrency=4, egress=LOOPBACK)
        planned = plan(source(f"az://{BUCKET}/m"), options)
        digests = {f.path: f.digest for f in planned.files}
        assert digests == {
            "config.json": StoreDigest("md5", hashlib.md5(SMALL).hexdigest(), "Content-MD5"),
            "weights.bin": None,
        }
        dest, peer = fetch_twice(planned, options, tmp_path)
    assert tree_of(dest) == {"weights.bin": BIG, "config.json": SMALL}
    assert peer.asked == set()  # no store digest, or an MD5 alone: never from a peer
    entries = manifest_entries(dest)
    assert (entries["config.json"]["verifiedBy"], entries["weights.bin"]["verifiedBy"]) == (
        "md5",
        "origin-only",
    )
    md5 = hashlib.md5(SMALL).hexdigest()
    assert entries["config.json"]["storeDigest"] == {"value": md5, "from": "Content-MD5"}


@pytest.mark.skipif(azurite.skip_reason() is not None, reason=azurite.skip_reason() or "")
def test_when_signing_fails_the_objects_come_from_the_origin_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Signing needs the cloud's signing service under workload identity (IAM signBlob, a user
    delegation key); refused, it is not asked again per object, and nothing fails."""
    with azurite.Azurite(tmp_path / "azurite") as server:
        service = server.service()
        service.create_container(BUCKET)
        for i in range(40):
            service.get_blob_client(BUCKET, f"m/{i}.txt").upload_blob(SMALL)
        options = Options(credentials=server.settings(), egress=LOOPBACK)
        calls: list[str] = []

        def refused(store: object, method: str, path: str, expires: object) -> str:
            calls.append(path)
            raise ValueError("the signing service refused")  # as obstore reports a refused signBlob

        monkeypatch.setattr("obstore.sign", refused)  # storesums calls obstore.sign at use
        planned = plan(source(f"az://{BUCKET}/m"), options)
    assert len(planned.files) == 40 and all(f.digest is None for f in planned.files)
    assert 1 <= len(calls) <= storesums.CONCURRENCY  # given up after the first refusal
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "praesto.download" and r.levelname == "WARNING"
    ]
    assert len(warnings) == 1 and "signing the HEAD failed" in warnings[0] and "origin only" in warnings[0]
