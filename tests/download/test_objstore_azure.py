"""az:// sources against Azurite (Azure Blob Storage emulator, npm) on loopback.

Azurite enforces Shared Key auth with its development account, so a wrong key and an
anonymous request are refused as Azure refuses them. Skips when scripts/install.sh has
not installed Azurite (it needs Node.js).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.download import DownloadError
from praesto.agent.download.fetch import plan

from praesto import names
from testkit.azurite import ACCOUNT_KEY, Azurite, skip_reason
from testkit.objstore_checks import (
    check_prefix_download,
    options,
    run_cli,
    sample_files,
    source,
    write_secret_dir,
)
from tests.download.conftest import tree_of

CONTAINER = "models"
SKIP = skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


@dataclasses.dataclass
class Az:
    server: Azurite
    files: dict[str, bytes]


@pytest.fixture(scope="module")
def az(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Az]:
    with Azurite(tmp_path_factory.mktemp("azurite")) as server:
        service = server.service()
        service.create_container(CONTAINER)
        files = sample_files()
        for path, data in files.items():
            service.get_blob_client(CONTAINER, f"llama/v1/{path}").upload_blob(data)
        service.get_blob_client(CONTAINER, "other/x.bin").upload_blob(b"not in the prefix")
        yield Az(server, files)


def test_prefix_download_is_verified_and_ranged(az: Az, tmp_path: Path) -> None:
    opts = options(az.server.settings())
    resolved = check_prefix_download(
        f"az://{CONTAINER}/llama/v1", opts, az.files, tmp_path / "m", az.server.ranged_reads
    )
    assert all(f.key and f.key.startswith("llama/v1/") for f in resolved.files)


def test_wrong_key_is_unauthorized_without_the_key(az: Az, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = base64.b64encode(os.urandom(64)).decode()
    opts = options(az.server.settings(key=wrong), credentials_from="Secret ns/az-creds")
    with pytest.raises(DownloadError) as info:
        plan(source(f"az://{CONTAINER}/llama/v1"), opts)
    assert info.value.reason == "Unauthorized"
    assert "AuthorizationFailure" in info.value.message and "Secret ns/az-creds" in info.value.message
    assert wrong not in info.value.message and wrong not in caplog.text
    assert ACCOUNT_KEY not in caplog.text


def test_anonymous_refusal_waits_for_credentials(az: Az) -> None:
    settings = az.server.settings()
    del settings["AZURE_STORAGE_ACCESS_KEY"]
    with pytest.raises(DownloadError) as info:
        plan(source(f"az://{CONTAINER}/llama/v1"), options(settings))
    assert info.value.reason == "WaitingForCredentials"
    assert "spec.source.secretRef" in info.value.message


def test_missing_container_and_empty_prefix(az: Az) -> None:
    opts = options(az.server.settings())
    with pytest.raises(DownloadError) as info:
        plan(source("az://no-such-container/x"), opts)
    assert info.value.reason == "RepoNotFound"
    assert (
        "'no-such-container' does not exist" in info.value.message
        and "ContainerNotFound" in info.value.message
    )
    with pytest.raises(DownloadError) as info:
        plan(source(f"az://{CONTAINER}/nothing-here"), opts)
    assert info.value.reason == "RepoNotFound" and "no object at or under" in info.value.message


def test_cli_downloads_with_a_mounted_secret_and_refuses_a_wrong_key(az: Az, tmp_path: Path) -> None:
    secret_dir = write_secret_dir(tmp_path / "secret", az.server.settings())
    volume = tmp_path / "pvc"
    volume.mkdir()
    args = [
        "download",
        f"az://{CONTAINER}/llama/v1",
        "--dest",
        str(volume),
        "--credentials-dir",
        str(secret_dir),
    ]
    done = run_cli([*args, "--part-size", "1", "--max-bytes", "64Mi"], {})
    assert done.returncode == 0, done.stderr
    assert tree_of(volume) == az.files
    assert ACCOUNT_KEY not in done.stdout + done.stderr
    assert ACCOUNT_KEY not in (volume / names.MANIFEST_FILE).read_text()

    wrong = base64.b64encode(os.urandom(64)).decode()
    bad_dir = write_secret_dir(tmp_path / "bad", az.server.settings(key=wrong))
    done = run_cli(
        ["download", f"az://{CONTAINER}/llama/v1", "--dest", str(tmp_path / "b"), "--credentials-dir",
         str(bad_dir), "--log-level", "DEBUG"], {},
    )  # fmt: skip
    assert done.returncode == 1 and "Unauthorized" in done.stderr
    assert wrong not in done.stdout + done.stderr
