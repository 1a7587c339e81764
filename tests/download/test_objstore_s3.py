"""s3:// sources against a real S3 server on loopback (moto in server mode, IAM auth on).

Covers ranged reads, versions pinned and recorded, the listing revision, wrong keys,
anonymous refusals, a missing bucket, MD5 verification, the size refusal and the CLI.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.download import DownloadError, Options
from praesto.agent.download.digests import StoreDigest
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.origins.objstore.plan import revision_of

from praesto import names
from praesto.spec import Source, parse_uri
from testkit.egress import LOOPBACK, LOOPBACK_ENV
from testkit.s3server import S3Server, private_bucket_endpoint
from tests.download.conftest import tree_of

MiB = 1 << 20
BUCKET = "models"


@dataclasses.dataclass
class S3:
    server: S3Server
    key: tuple[str, str]
    files: dict[str, bytes]

    def creds(self, **extra: str) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.key[0],
            "AWS_SECRET_ACCESS_KEY": self.key[1],
            "AWS_ENDPOINT_URL": self.server.endpoint,
            **extra,
        }

    def options(self, **kwargs: object) -> Options:
        defaults: dict[str, object] = {"credentials": self.creds(), "part_size": 1 * MiB, "concurrency": 4,
                                       "egress": LOOPBACK}  # fmt: skip
        defaults.update(kwargs)
        return Options(**defaults)  # type: ignore[arg-type]

    def client(self) -> object:
        return self.server.client(self.key)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    with S3Server(tmp_path_factory.mktemp("moto"), auth_actions=3) as server:
        key = server.create_key()
        client = server.client(key)
        client.create_bucket(Bucket=BUCKET)
        client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        files = {
            "config.json": b'{"model_type": "test"}',
            "model.safetensors": os.urandom(5 * MiB + 17),
            "tokenizer/vocab.txt": b"a\nb\nc\n" * 1000,
            "empty.txt": b"",
        }
        for path, data in files.items():
            client.put_object(Bucket=BUCKET, Key=f"llama/v1/{path}", Body=data)
        client.put_object(Bucket=BUCKET, Key="other/x.bin", Body=b"not in the prefix")
        client.put_object(Bucket=BUCKET, Key="single/weights.bin", Body=b"one object")
        yield S3(server, key, files)


def _src(uri: str) -> Source:
    source, errors = parse_uri(uri)
    assert source is not None and not errors
    return source


def test_prefix_download_is_verified_versioned_and_ranged(s3: S3, tmp_path: Path) -> None:
    options = s3.options()
    resolved = plan(_src(f"s3://{BUCKET}/llama/v1"), options)
    assert {f.path for f in resolved.files} == set(s3.files)
    assert all(f.version and f.etag for f in resolved.files)  # versioned bucket: HEADs recorded them
    assert resolved.revision == revision_of(resolved.files)
    log_before = s3.server.log_path.read_text().count(" 206 ")

    result = download(resolved, tmp_path / "m", options)

    assert tree_of(tmp_path / "m") == s3.files
    assert result.bytes_from_origin == sum(len(v) for v in s3.files.values())
    ranged = s3.server.log_path.read_text().count(" 206 ") - log_before
    assert ranged >= 6  # the 5 MiB object came as 1 MiB ranges (moto logs each 206 Partial Content)
    manifest = json.loads((tmp_path / "m" / names.MANIFEST_FILE).read_text())
    assert manifest["resolvedRevision"] == resolved.revision
    by_path = {f["path"]: f for f in manifest["files"]}
    for f in resolved.files:
        assert by_path[f.path]["version"] == f.version and by_path[f.path]["etag"] == f.etag
    import hashlib

    assert by_path["model.safetensors"]["sha256"] == hashlib.sha256(s3.files["model.safetensors"]).hexdigest()
    assert (tmp_path / "m" / names.COMPLETE_FILE).read_text().strip() == resolved.revision


def test_planned_versions_are_what_is_fetched(s3: S3, tmp_path: Path) -> None:
    """An object overwritten after planning: the download still gets the planned version."""
    client = s3.server.client(s3.key)
    client.put_object(Bucket=BUCKET, Key="pinned/w.bin", Body=b"first" * 1000)
    options = s3.options()
    first = plan(_src(f"s3://{BUCKET}/pinned"), options)
    client.put_object(Bucket=BUCKET, Key="pinned/w.bin", Body=b"second" * 1000)

    download(first, tmp_path / "m", options)
    assert (tmp_path / "m" / "w.bin").read_bytes() == b"first" * 1000

    second = plan(_src(f"s3://{BUCKET}/pinned"), options)
    assert second.revision != first.revision
    assert second.files[0].version != first.files[0].version


def test_single_object_uri_and_patterns(s3: S3, tmp_path: Path) -> None:
    options = s3.options()
    single = plan(_src(f"s3://{BUCKET}/single/weights.bin"), options)
    assert [(f.path, f.key) for f in single.files] == [("weights.bin", "single/weights.bin")]
    download(single, tmp_path / "one", options)
    assert tree_of(tmp_path / "one") == {"weights.bin": b"one object"}

    source = dataclasses.replace(_src(f"s3://{BUCKET}/llama/v1"), allow_patterns=("*.json", "tokenizer/*"))
    assert {f.path for f in plan(source, options).files} == {"config.json", "tokenizer/vocab.txt"}


def test_wrong_key_is_unauthorized_without_the_secret(s3: S3, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "wrongSECRETvalue1234567890"
    options = s3.options(
        credentials=s3.creds(AWS_ACCESS_KEY_ID="AKIAWRONGWRONGWRONG1", AWS_SECRET_ACCESS_KEY=secret)
    )
    with pytest.raises(DownloadError) as info:
        plan(_src(f"s3://{BUCKET}/llama/v1"), options)
    assert info.value.reason == "Unauthorized"
    assert "InvalidAccessKeyId" in info.value.message and "check the key" in info.value.message
    assert secret not in info.value.message and secret not in caplog.text
    assert "AKIAWRONG" not in info.value.message


def test_anonymous_refusal_waits_for_credentials() -> None:
    with private_bucket_endpoint() as endpoint:
        with pytest.raises(DownloadError) as info:
            plan(
                _src(f"s3://{BUCKET}/llama/v1"),
                Options(credentials={"AWS_ENDPOINT_URL": endpoint}, egress=LOOPBACK),
            )
    assert info.value.reason == "WaitingForCredentials"
    assert "spec.source.secretRef" in info.value.message and "credentials.secretRef" in info.value.message


def test_half_a_key_names_the_missing_one(s3: S3) -> None:
    options = s3.options(
        credentials={"AWS_ACCESS_KEY_ID": "AKIAONLYHALF", "AWS_ENDPOINT_URL": s3.server.endpoint},
        credentials_from="Secret ns/s3-creds",
    )
    with pytest.raises(DownloadError) as info:
        plan(_src(f"s3://{BUCKET}/llama/v1"), options)
    assert info.value.reason == "WaitingForCredentials"
    assert "Secret ns/s3-creds" in info.value.message and "AWS_SECRET_ACCESS_KEY" in info.value.message


def test_missing_bucket_and_empty_prefix(s3: S3) -> None:
    with pytest.raises(DownloadError) as info:
        plan(_src("s3://no-such-bucket/x"), s3.options())
    assert info.value.reason == "RepoNotFound" and "'no-such-bucket' does not exist" in info.value.message
    with pytest.raises(DownloadError) as info:
        plan(_src(f"s3://{BUCKET}/nothing-here"), s3.options())
    assert info.value.reason == "RepoNotFound" and "no object at or under" in info.value.message


def test_md5_mismatch_fails_after_one_refetch(s3: S3, tmp_path: Path) -> None:
    """The listing's MD5 (ETag) is checked against the bytes: a wrong one fails the file."""
    options = s3.options()
    resolved = plan(_src(f"s3://{BUCKET}/llama/v1"), options)
    files = tuple(
        dataclasses.replace(f, digest=StoreDigest("md5", "0" * 32, "ETag")) if f.path == "config.json" else f
        for f in resolved.files
    )
    with pytest.raises(DownloadError) as info:
        download(dataclasses.replace(resolved, files=files), tmp_path / "m", options)
    assert (
        info.value.reason == "ChecksumMismatch"
        and "expected md5 " + "0" * 32 + " (ETag)" in info.value.message
    )
    assert not (tmp_path / "m").exists()
    no_md5 = plan(_src(f"s3://{BUCKET}/llama/v1"), s3.options(credentials=s3.creds(S3_VERIFY_ETAG_MD5="0")))
    assert not any(
        f.digest and f.digest.header == "ETag" for f in no_md5.files
    )  # SSE-KMS: ETags are not MD5s


def test_size_larger_than_max_bytes_is_refused_before_writing(s3: S3, tmp_path: Path) -> None:
    options = s3.options(max_bytes=1 * MiB)
    resolved = plan(_src(f"s3://{BUCKET}/llama/v1"), options)
    volume = tmp_path / "pvc"
    volume.mkdir()
    with pytest.raises(DownloadError) as info:
        download(resolved, volume, options)
    assert info.value.reason == "SizeExceedsRequest"
    assert str(resolved.total_bytes) in info.value.message and str(MiB) in info.value.message
    assert list(volume.iterdir()) == []  # nothing written, not even staging


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HF_"))} | LOOPBACK_ENV
    return subprocess.run(
        [sys.executable, "-m", "praesto.agent.cli", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_downloads_with_env_credentials_and_a_mounted_secret(s3: S3, tmp_path: Path) -> None:
    env = s3.server.env(s3.key)
    done = _cli(
        ["download", f"s3://{BUCKET}/llama/v1", "--dest", str(tmp_path / "a"), "--part-size", "1"], env
    )
    assert done.returncode == 0, done.stderr
    assert tree_of(tmp_path / "a") == s3.files
    assert s3.key[1] not in done.stdout + done.stderr

    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    for key, value in s3.creds().items():
        (secret_dir / key).write_text(value + "\n")
    volume = tmp_path / "pvc"
    volume.mkdir()
    args = [
        "download",
        f"s3://{BUCKET}/llama/v1",
        "--dest",
        str(volume),
        "--credentials-dir",
        str(secret_dir),
    ]
    done = _cli([*args, "--max-bytes", "64Mi", "--allow-pattern", "*.json"], {})
    assert done.returncode == 0, done.stderr
    assert tree_of(volume) == {"config.json": s3.files["config.json"]}
    manifest = (volume / names.MANIFEST_FILE).read_text()
    assert s3.key[1] not in manifest and s3.key[0] not in manifest


def test_cli_refusals_are_clear_and_scrubbed(s3: S3, tmp_path: Path) -> None:
    secret = "thisISaWRONGsecretKEY0123456789"
    env = {**s3.server.env(("AKIAWRONGWRONGWRONG1", secret))}
    done = _cli(
        ["download", f"s3://{BUCKET}/llama/v1", "--dest", str(tmp_path / "a"), "--log-level", "DEBUG"], env
    )
    assert done.returncode == 1
    assert "Unauthorized" in done.stderr and secret not in done.stdout + done.stderr

    done = _cli(
        ["download", f"s3://{BUCKET}/llama/v1", "--dest", str(tmp_path / "b"), "--max-bytes", "1Mi"],
        s3.server.env(s3.key),
    )
    assert done.returncode == 3 and "SizeExceedsRequest" in done.stderr and "storage.size" in done.stderr
