"""How much an OCI archive layer may write (issue #37, 2): the three reproductions, end to end.

A few KB pushed by the ORAS CLI to the CNCF distribution registry expand to MiBs against a
storage.size of 1 MiB: an `oras push` folder (tar+gzip), a ModelPack tar+zstd layer without file
metadata, a ModelPack layer whose metadata claims 1 TiB. Each is refused with SizeExceedsRequest
(the PVC Job's exit 3, which its podFailurePolicy fails at once), the staged tree held no more than
the bound when unpacking stopped, and nothing is left: no copy, no staging. In node mode the room
reserves what check_request counted (the whole storage.size for a layer that does not say).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from praesto.agent.copies import CacheRef, Copies
from praesto.agent.credentials import CredentialPolicy
from praesto.agent.download import Options, Plan
from praesto.agent.download.api import Archive, EngineSettings, LastingDownloadError, RemoteFile
from praesto.agent.download.fetch import check_size, download, plan
from praesto.agent.jobs import Job, check_request
from praesto.agent.kube import KubeApi
from praesto.agent.room import DiskRoom

from praesto import names
from praesto.spec import Source, parse_uri
from praesto.store import StoreLayout
from testkit.egress import LOOPBACK, LOOPBACK_ENV
from testkit.oci_artifacts import Layer, push_files, push_modelpack
from testkit.registry import Registry
from tests.download.test_oci_registry import binaries, registry  # noqa: F401  (the fixtures)

BOUND = 1 << 20  # storage.size 1Mi
SHARD = 256 << 10
download_module = importlib.import_module("praesto.agent.download.fetch")


def _source(registry: Registry, repository: str, tag: str) -> Source:  # noqa: F811
    source, errors = parse_uri(f"oci://{registry.reference(repository, tag)}")
    assert source is not None and not errors
    return source


@pytest.fixture
def landed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes the staged tree held when each unpack ended, before fetch/ removes staging: the
    real unpack_layers, measured as it returns or raises."""
    sizes: list[int] = []
    real: Callable[..., Plan] = download_module.unpack_layers

    def measured(planned: Plan, tree: Path, *rest: Any) -> Plan:
        try:
            return real(planned, tree, *rest)
        finally:
            sizes.append(sum(p.stat().st_size for p in tree.rglob("*") if p.is_file()))

    monkeypatch.setattr(download_module, "unpack_layers", measured)
    return sizes


def _empty(folder: Path) -> bool:
    return not folder.exists() or not any(folder.iterdir())


def _refused(registry: Registry, repository: str, dest: Path) -> LastingDownloadError:  # noqa: F811
    staging, blobs = dest.parent / "staging", dest.parent / "blobs"
    options = Options(plain_http=True, max_bytes=BOUND, staging_dir=staging, blobs_dir=blobs, egress=LOOPBACK)
    with pytest.raises(LastingDownloadError) as refused:
        download(plan(_source(registry, repository, "1.0"), options), dest, options)
    assert not dest.exists() and not staging.exists() and _empty(blobs)  # nothing half-written is left
    return refused.value


def test_an_oras_folder_expanding_past_storage_size_stops_as_it_crosses(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
    landed: list[int],
) -> None:
    files = {f"weights/shard-{n}.bin": bytes(SHARD) for n in range(16)}  # 4 MiB of zeros
    push_files(registry, "team/folder", "1.0", files, tmp_path / "push", folders=("weights",))
    pushed = registry.blob_bytes()
    error = _refused(registry, "team/folder", tmp_path / "model")
    assert error.reason == "SizeExceedsRequest" and "unpacking stopped" in error.message
    assert "spec.storage.size 1.0 MiB (1048576 bytes)" in error.message and "'weights'" in error.message
    assert landed and landed[-1] <= BOUND  # at most the bound on disk, the layer itself included
    assert landed[-1] >= 3 * SHARD  # stopped as it crossed: the shards before it landed
    assert registry.blob_bytes() - pushed < 64 << 10  # a few KB fetched, MiBs refused


def test_a_modelpack_zstd_layer_without_metadata_stops_as_it_crosses(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
    landed: list[int],
) -> None:
    layers = [
        Layer("config.json", b'{"model_type": "tiny"}', kind="weight.config"),
        Layer("model.safetensors", bytes(4 << 20), packing="tar+zstd", metadata=False),
    ]
    push_modelpack(registry, "team/zstd", "1.0", layers, tmp_path / "push")
    error = _refused(registry, "team/zstd", tmp_path / "model")
    assert error.reason == "SizeExceedsRequest" and "member 'model.safetensors'" in error.message
    assert landed and landed[-1] <= BOUND


def test_a_modelpack_layer_claiming_a_tebibyte_is_refused_before_a_byte(
    registry: Registry,  # noqa: F811
    tmp_path: Path,
    landed: list[int],
) -> None:
    layer = Layer("model.safetensors", bytes(4 << 20), packing="tar+gzip", size_claim=1 << 40)
    push_modelpack(registry, "team/claim", "1.0", [layer], tmp_path / "push")
    pushed = registry.blob_bytes()
    error = _refused(registry, "team/claim", tmp_path / "model")
    assert error.reason == "SizeExceedsRequest" and "takes 1.0 TiB" in error.message
    assert "nothing was written" in error.message
    assert landed == [] and registry.blob_bytes() == pushed  # not one byte of the layer fetched


def test_the_pvc_job_command_exits_too_large_with_one_line(registry: Registry, tmp_path: Path) -> None:  # noqa: F811
    """The PVC Job's `praesto-agent download --max-bytes <storage.size>` (hooks/pvc_job.py): exit 3,
    which its podFailurePolicy fails at once: no retry of a lasting cause."""
    files = {f"weights/shard-{n}.bin": bytes(SHARD) for n in range(16)}
    push_files(registry, "team/job", "1.0", files, tmp_path / "push", folders=("weights",))
    dest = tmp_path / "volume"
    dest.mkdir()  # the PVC's mount point: staging lives inside it
    done = subprocess.run(
        [sys.executable, "-m", "praesto.agent.cli", "download", f"oci://{registry.reference('team/job', '1.0')}",
         "--dest", str(dest), "--plain-http", "--max-bytes", "1Mi"],
        capture_output=True, text=True, timeout=120, env={**os.environ, **LOOPBACK_ENV},
    )  # fmt: skip
    assert done.returncode == names.DOWNLOAD_EXIT_TOO_LARGE, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: SizeExceedsRequest: ")
    assert list(dest.iterdir()) == []  # nothing published, staging removed


def test_a_node_copy_reserves_storage_size_and_fails_naming_the_cause(
    binaries: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Node mode (agent/jobs.py): check_request and the room count what lands, not the few KB
    fetched: a layer that does not say reserves the whole storage.size, and unpacking stops there."""
    with Registry(tmp_path / "tls", tls=True) as tls:
        layers = [Layer("model.safetensors", bytes(4 << 20), packing="tar+zstd", metadata=False)]
        push_modelpack(tls, "team/node", "1.0", layers, tmp_path / "push")
        layout = StoreLayout(tmp_path / "store")
        layout.base.mkdir(parents=True)
        room = DiskRoom(layout, Copies(), "0")
        ref = CacheRef("team-a", "bomb-node-a", "bomb", _source(tls, "team/node", "1.0"), BOUND, None)
        reserved: list[int] = []

        def started(started_ref: CacheRef, planned: Plan) -> None:
            reserved.append(room.reservations.held[("team-a", "bomb")])

        job = Job(ref, layout, cast(KubeApi, None), EngineSettings(ca_bundle=str(tls.ca_path), egress=LOOPBACK), room, started,
                  lambda *_: None, plan, download, CredentialPolicy())  # fmt: skip
        outcome = job.run()
    assert outcome.error is not None and outcome.error.reason == "SizeExceedsRequest", outcome
    assert isinstance(outcome.error, LastingDownloadError)  # the long backoff, not a retry loop
    assert reserved == [BOUND] and room.reservations.held == {}  # reserved the bound, given back
    assert not layout.cache_dir("team-a", "bomb").exists()
    assert not layout.staging_dir("team-a", "bomb").exists()
    assert _empty(layout.blobs_dir)  # neither the layer nor what it unpacked stays in the blob area


def test_an_uncompressed_tar_counts_no_more_than_itself(registry: Registry, tmp_path: Path) -> None:  # noqa: F811
    """A tar holds no more than its own size, whatever its metadata claims: 1 TiB claimed, 300 KB
    real, within 1 MiB (the layer and its unpacked file together)."""
    weights = bytes(300_000)
    layer = Layer("model.safetensors", weights, packing="tar", size_claim=1 << 40)
    push_modelpack(registry, "team/tar", "1.0", [layer], tmp_path / "push")
    options = Options(plain_http=True, max_bytes=BOUND, egress=LOOPBACK)
    planned = plan(_source(registry, "team/tar", "1.0"), options)
    assert planned.disk_bytes(BOUND) == 2 * planned.total_bytes < BOUND
    download(planned, tmp_path / "model", options)
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == weights


def test_every_check_counts_what_lands_not_what_is_fetched() -> None:
    """check_request (node), check_size (PVC Job, `praesto plan`) and the room share Plan.disk_bytes."""
    source = Source("oci", "127.0.0.1:5000/team/m", "1.0")
    silent = RemoteFile(".praesto-layers/a", 8_000, sha256="a" * 64, archive=Archive("tar+gzip", "w", None))
    claims = RemoteFile(
        ".praesto-layers/b", 8_000, sha256="b" * 64, archive=Archive("tar+zstd", "w", 1 << 40)
    )
    unknown, huge = Plan(source, "r", (silent,)), Plan(source, "r", (claims,))
    assert (unknown.disk_bytes(None), unknown.disk_bytes(BOUND)) == (8_000, BOUND)
    assert huge.disk_bytes(BOUND) == 8_000 + (1 << 40)
    ref = CacheRef("team-a", "m-node-a", "m", source, BOUND, None)
    check_request(ref, unknown)  # the bound is reserved; unpacking stops there
    check_size(unknown, Options(max_bytes=BOUND))
    with pytest.raises(LastingDownloadError, match=r"the model is 1\.0 TiB") as node:
        check_request(ref, huge)
    with pytest.raises(LastingDownloadError, match=r"takes 1\.0 TiB") as pvc:
        check_size(huge, Options(max_bytes=BOUND))
    assert node.value.reason == pvc.value.reason == "SizeExceedsRequest"
