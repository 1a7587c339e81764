"""Azure Blob Storage on loopback: Azurite (npm `azurite`, installed project-locally into
build/azurite by scripts/install.sh), own process, in-memory, plain HTTP.

Azurite checks Shared Key signatures against its well-known development account
(`devstoreaccount1`), so a wrong key or an unsigned request is refused as Azure does.
Containers and blobs are set up with `azure-storage-blob`, an independent client.

    with Azurite(tmp_path) as az:
        az.service().create_container("models")
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from testkit import loopback_process

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / "build" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "devstoreaccount1"
# Azurite's published development key (docs: "Well-known storage account and key"); not a secret.
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def skip_reason() -> str | None:
    """Why the Azure emulator tests cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed: Azurite (npm) needs Node.js; install nodejs, then scripts/install.sh"
    if not BINARY.is_file():
        return f"Azurite is not installed at {BINARY}: run scripts/install.sh"
    return None


class Azurite:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.log_path = workdir / "azurite.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The blob endpoint with the account in its path, as Azurite serves it."""
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    def __enter__(self) -> Azurite:
        reason = skip_reason()
        if reason:
            raise RuntimeError(reason)
        self.workdir.mkdir(parents=True, exist_ok=True)

        def argv(port: int) -> list[str]:
            return [str(BINARY), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                    "--skipApiVersionCheck"]  # fmt: skip

        self.process, self.port = loopback_process.start(
            argv, lambda port: f"http://127.0.0.1:{port}/{ACCOUNT}?comp=list", self.log_path
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            loopback_process.stop(self.process)

    def ranged_reads(self) -> int:
        """How many 206 Partial Content answers Azurite's access log shows (one per ranged GET)."""
        return self.log_path.read_text().count('" 206 ')

    def service(self) -> Any:
        """An azure-storage-blob BlobServiceClient for set-up, signed with the development key."""
        from azure.storage.blob import BlobServiceClient

        connection = (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={self.endpoint};"
        )
        return BlobServiceClient.from_connection_string(connection)

    def settings(self, key: str = ACCOUNT_KEY) -> dict[str, str]:
        """The Secret keys a ModelCache's az:// source needs for this emulator."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT,
            "AZURE_STORAGE_ACCESS_KEY": key,
            "AZURE_STORAGE_ENDPOINT": self.endpoint,
        }
