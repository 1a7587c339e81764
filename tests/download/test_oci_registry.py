"""OCI sources against the CNCF distribution registry, artifacts pushed by the ORAS CLI (#26).

Both formats (ModelPack: raw, tar, tar+gzip, tar+zstd, config/doc kinds; `oras push` files and
folders), indexes, tags pinned to digests, token auth over TLS with a dockerconfigjson login,
mirrors, dedup with other sources, hostile archives, the CLI's exit codes and one-line reasons.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.budget.origin_budget import origin_host
from praesto.agent.download import Options
from praesto.agent.download.api import DownloadCancelled, DownloadError, EngineSettings, LastingDownloadError
from praesto.agent.download.fetch import download, plan

from praesto import names
from praesto.spec import parse_uri
from testkit.controlplane import ControlPlaneUnavailable
from testkit.egress import LOOPBACK, LOOPBACK_ENV
from testkit.oci_artifacts import Layer, archive, index, push_files, push_modelpack
from testkit.registry import Registry, docker_config, registry_binaries
from testkit.registry_token import Grants
from tests.download.conftest import MiB, tree_of

WEIGHTS = os.urandom(3 * MiB + 5)
CONFIG = b'{"model_type": "tiny"}'
READER = ("reader", "reader-password")


@pytest.fixture(scope="module")
def binaries() -> None:
    try:
        registry_binaries()
    except ControlPlaneUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"the OCI tests must run in CI: {err}")
        pytest.skip(str(err))


@pytest.fixture
def registry(binaries: None, tmp_path: Path) -> Iterator[Registry]:
    with Registry(tmp_path / "registry") as running:
        yield running


@pytest.fixture
def private(binaries: None, tmp_path: Path) -> Iterator[Registry]:
    """HTTPS with a test CA and token auth: `reader` may pull team/private, `pusher` may push it."""
    grants = Grants(
        users={"pusher": ("push-pw", {"team/private": {"pull", "push"}}), READER[0]: (READER[1], {"team/private": {"pull"}})},
        anonymous={"team/public": {"pull"}},
    )  # fmt: skip
    with Registry(tmp_path / "private", tls=True, grants=grants) as running:
        yield running


def _options(**kwargs: object) -> Options:
    defaults: dict[str, object] = {"part_size": 1 * MiB, "concurrency": 4, "egress": LOOPBACK}
    defaults.update(kwargs)
    return Options(**defaults)  # type: ignore[arg-type]


def _source(registry: Registry, repository: str, tag: str) -> object:
    source, errors = parse_uri(f"oci://{registry.reference(repository, tag)}")
    assert source is not None and not errors
    return source


def _fetch(registry: Registry, repository: str, tag: str, dest: Path, **kwargs: object) -> object:
    options = _options(plain_http=not registry.tls, **kwargs)
    planned = plan(_source(registry, repository, tag), options)  # type: ignore[arg-type]
    return download(planned, dest, options)


def test_a_modelpack_artifact_of_every_layer_kind_is_published_verified(
    registry: Registry, tmp_path: Path
) -> None:
    layers = [
        Layer("model.safetensors", WEIGHTS),  # raw: fetched in ranged parts like a Hub file
        Layer("config.json", CONFIG, kind="weight.config"),
        Layer("tokenizer/tokenizer.json", b'{"v": 1}' * 1000, packing="tar", kind="weight.config"),
        Layer("extra/weights-2.bin", os.urandom(200_000), packing="tar+gzip"),
        Layer("extra/weights-3.bin", os.urandom(150_000), packing="tar+zstd"),
        Layer("README.md", b"# tiny\n", kind="doc"),
        Layer("code/run.py", b"print('hi')\n", packing="tar", kind="code"),
    ]
    digest = push_modelpack(registry, "team/tiny", "1.0", layers, tmp_path / "push")
    blobs = tmp_path / "blobs"
    result = _fetch(registry, "team/tiny", "1.0", tmp_path / "model", blobs_dir=blobs)

    assert tree_of(tmp_path / "model") == {layer.path: layer.data for layer in layers}
    assert result.plan.revision == digest  # type: ignore[attr-defined]
    manifest = json.loads((tmp_path / "model" / names.MANIFEST_FILE).read_text())
    assert manifest["resolvedRevision"] == digest and manifest["revision"] == "1.0"
    entries = {f["path"]: f for f in manifest["files"]}
    assert entries["model.safetensors"]["sha256"] == hashlib.sha256(WEIGHTS).hexdigest()
    assert (
        entries["extra/weights-3.bin"]["verifiedBy"] == "oci-layer-sha256"
        and entries["extra/weights-3.bin"]["layer"]
    )
    assert {layer["kind"] for layer in manifest[names.MANIFEST_LAYERS]} == {"tar", "tar+gzip", "tar+zstd"}
    assert not any(p.name.startswith(".praesto-layers") for p in (tmp_path / "model").iterdir())
    # every file, unpacked ones included, is in the content-addressed area: the store keeps it once
    weights_3 = tmp_path / "model" / "extra/weights-3.bin"
    assert (
        blobs / hashlib.sha256(weights_3.read_bytes()).hexdigest()
    ).stat().st_ino == weights_3.stat().st_ino

    again = _fetch(
        registry, "team/tiny", "1.0", tmp_path / "model", blobs_dir=blobs
    )  # complete: nothing fetched
    assert again.bytes_from_origin == 0  # type: ignore[attr-defined]


def test_oras_push_files_and_a_folder_and_the_tag_moves_but_a_digest_does_not(
    registry: Registry, tmp_path: Path
) -> None:
    files = {
        "weights.bin": WEIGHTS,
        "config.json": CONFIG,
        "tokenizer/vocab.txt": b"a\nb\n",
        "tokenizer/merges.txt": b"m",
    }
    first = push_files(registry, "team/oras", "stable", files, tmp_path / "v1", folders=("tokenizer",))
    _fetch(registry, "team/oras", "stable", tmp_path / "a")
    assert tree_of(tmp_path / "a") == files
    push_files(registry, "team/oras", "stable", {"weights.bin": b"new"}, tmp_path / "v2")  # the tag moves on
    _fetch(registry, "team/oras", first, tmp_path / "pinned")  # a digest still names the first
    assert tree_of(tmp_path / "pinned") == files


def test_an_index_is_followed_to_its_one_model_and_one_with_two_is_refused(
    registry: Registry, tmp_path: Path
) -> None:
    one = push_modelpack(registry, "team/idx", "a", [Layer("w.bin", b"a" * 1000)], tmp_path / "a")
    two = push_modelpack(registry, "team/idx", "b", [Layer("w.bin", b"b" * 1000)], tmp_path / "b")
    single = index(registry, "team/idx", "single", one)
    result = _fetch(registry, "team/idx", "single", tmp_path / "single")
    assert tree_of(tmp_path / "single") == {"w.bin": b"a" * 1000}
    assert result.plan.revision == single  # type: ignore[attr-defined]  # what the tag names: the index
    index(registry, "team/idx", "both", one, two)
    with pytest.raises(LastingDownloadError) as refused:
        _fetch(registry, "team/idx", "both", tmp_path / "both")
    assert (
        refused.value.reason == "InvalidRepoFile"
        and one in refused.value.message
        and two in refused.value.message
    )


def test_token_auth_over_tls_takes_the_dockerconfigjson_login(private: Registry, tmp_path: Path) -> None:
    push_modelpack(
        private, "team/private", "1.0", [Layer("w.bin", WEIGHTS)], tmp_path / "p", user=("pusher", "push-pw")
    )
    ca = str(private.ca_path)
    with pytest.raises(LastingDownloadError) as anonymous:
        _fetch(private, "team/private", "1.0", tmp_path / "anon", ca_bundle=ca)
    assert anonymous.value.reason == "WaitingForCredentials" and "dockerconfigjson" in anonymous.value.message
    wrong = {names.DOCKER_CONFIG_KEY: docker_config(private, READER[0], "wrong")}
    with pytest.raises(LastingDownloadError) as refused:
        _fetch(private, "team/private", "1.0", tmp_path / "wrong", ca_bundle=ca, credentials=wrong,
               credentials_from="Secret team/regcred")  # fmt: skip
    assert refused.value.reason == "Unauthorized" and "Secret team/regcred" in refused.value.message
    assert "wrong" not in refused.value.message
    login = {names.DOCKER_CONFIG_KEY: docker_config(private, *READER)}
    _fetch(private, "team/private", "1.0", tmp_path / "ok", ca_bundle=ca, credentials=login)
    assert tree_of(tmp_path / "ok") == {"w.bin": WEIGHTS}
    assert private.token is not None and any(user == READER[0] for user, _ in private.token.issued)
    with pytest.raises(LastingDownloadError) as untrusted:  # the registry's CA is not trusted
        _fetch(private, "team/private", "1.0", tmp_path / "no-ca", credentials=login)
    assert untrusted.value.reason == "SourceUnavailable" and "downloads.caBundle" in untrusted.value.message


def test_a_mirror_serves_first_and_a_dead_mirror_falls_through(registry: Registry, tmp_path: Path) -> None:
    with Registry(tmp_path / "mirror") as mirror:
        push_modelpack(mirror, "team/m", "1.0", [Layer("w.bin", WEIGHTS)], tmp_path / "on-mirror")
        digest = push_modelpack(registry, "team/m", "1.0", [Layer("w.bin", WEIGHTS)], tmp_path / "on-origin")
        mirrors = {registry.host: ["http://127.0.0.1:9", mirror.base_url]}  # port 9: nothing listens
        # PRAESTO_OCI_MIRRORS as the process edge reads it (EngineSettings.from_environment)
        env = {names.ENV_OCI_MIRRORS: json.dumps(mirrors)}
        mirrored = EngineSettings.from_environment(env).oci_mirrors
        planned = _fetch(registry, "team/m", digest, tmp_path / "model", oci_mirrors=mirrored).plan  # type: ignore[attr-defined]
        assert (
            origin_host(planned, _options(oci_mirrors=mirrored)) == mirror.host
        )  # the origin budget counts who serves
        assert tree_of(tmp_path / "model") == {"w.bin": WEIGHTS}
        assert mirror.blob_bytes() == len(WEIGHTS) and registry.blob_bytes() == 0


def test_identical_bytes_from_the_hub_and_a_registry_are_stored_once(
    registry: Registry, tmp_path: Path
) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / hashlib.sha256(WEIGHTS).hexdigest()).write_bytes(WEIGHTS)  # as a Hub download leaves it
    push_modelpack(registry, "team/dedup", "1.0", [Layer("w.bin", WEIGHTS)], tmp_path / "p")
    result = _fetch(registry, "team/dedup", "1.0", tmp_path / "model", blobs_dir=blobs)
    assert result.bytes_deduplicated == len(WEIGHTS) and registry.blob_bytes() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("blob", "size_claim", "says"),
    [
        (archive("../escape.bin", b"x", "tar"), None, "would land outside the model"),
        (archive("w.bin", b"x" * 5000, "tar+gzip"), 100, "takes the layer past"),
    ],
)
def test_hostile_layers_are_refused_and_nothing_is_published(
    registry: Registry, tmp_path: Path, blob: bytes, size_claim: int | None, says: str
) -> None:
    layer = Layer(
        "w.bin",
        b"x",
        packing="tar+gzip" if blob[:2] == b"\x1f\x8b" else "tar",
        blob=blob,
        size_claim=size_claim,
    )
    push_modelpack(registry, "team/hostile", "1.0", [layer], tmp_path / "p")
    with pytest.raises(LastingDownloadError, match=says) as refused:
        _fetch(registry, "team/hostile", "1.0", tmp_path / "model")
    assert refused.value.reason == "InvalidRepoFile"
    assert not (tmp_path / "model").exists() and not (tmp_path / "escape.bin").exists()


def test_a_container_image_layer_is_refused_naming_the_fix(registry: Registry, tmp_path: Path) -> None:
    (tmp_path / "layer.tar.gz").write_bytes(archive("bin/sh", b"#!", "tar+gzip"))
    registry.oras("push", registry.reference("team/image", "1.0"),
                  "layer.tar.gz:application/vnd.oci.image.layer.v1.tar+gzip", "--disable-path-validation",
                  cwd=tmp_path)  # fmt: skip
    # oras names every file it pushes, so an image's unnamed layer is pushed as its manifest alone
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                           "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", "size": 2},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": "sha256:" + hashlib.sha256((tmp_path / "layer.tar.gz").read_bytes()).hexdigest(),
                            "size": (tmp_path / "layer.tar.gz").stat().st_size}]}  # fmt: skip
    (tmp_path / "image.json").write_text(json.dumps(manifest))
    registry.oras("manifest", "push", registry.reference("team/image", "image"), "image.json", cwd=tmp_path)
    with pytest.raises(LastingDownloadError, match="a container image, not a model artifact"):
        _fetch(registry, "team/image", "image", tmp_path / "model")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "praesto.agent.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **LOOPBACK_ENV, **(env or {})})  # fmt: skip


def test_the_cli_downloads_both_formats_and_refuses_with_one_line(
    private: Registry, registry: Registry, tmp_path: Path
) -> None:
    push_files(registry, "team/cli", "1.0", {"weights.bin": WEIGHTS}, tmp_path / "files")
    ok = _cli(
        "download",
        f"oci://{registry.reference('team/cli', '1.0')}",
        "--dest",
        str(tmp_path / "a"),
        "--plain-http",
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert tree_of(tmp_path / "a") == {"weights.bin": WEIGHTS}

    push_modelpack(private, "team/private", "1.0", [Layer("w.bin", WEIGHTS, packing="tar+zstd")], tmp_path / "mp",
                   user=("pusher", "push-pw"))  # fmt: skip
    (tmp_path / "config.json").write_text(docker_config(private, *READER))
    env = {names.ENV_CA_BUNDLE: str(private.ca_path)}
    source = f"oci://{private.reference('team/private', '1.0')}"
    denied = _cli("download", source, "--dest", str(tmp_path / "b"), env=env)
    assert denied.returncode == 1 and "error: WaitingForCredentials: " in denied.stderr
    fetched = _cli(
        "download",
        source,
        "--dest",
        str(tmp_path / "b"),
        "--registry-config",
        str(tmp_path / "config.json"),
        env=env,
    )
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    assert tree_of(tmp_path / "b") == {"w.bin": WEIGHTS} and READER[1] not in fetched.stderr + fetched.stdout
    remote = _cli(
        "download", "oci://registry.example.com/team/m:1.0", "--dest", str(tmp_path / "c"), "--plain-http"
    )
    assert (
        remote.returncode == 1
        and "plain HTTP is allowed only for a registry on this machine" in remote.stderr
    )


def test_a_cancelled_pull_resumes_from_its_staging_and_reads_only_the_rest(
    registry: Registry, tmp_path: Path
) -> None:
    """Resume applies to registry blobs as to Hub files: the journal keeps the verified parts."""
    big = os.urandom(40 * MiB)
    push_modelpack(registry, "team/resume", "1.0", [Layer("model.bin", big), Layer("config.json", CONFIG,
                   kind="weight.config")], tmp_path / "push")  # fmt: skip
    cancel = threading.Event()

    def progress(done: int, total: int) -> None:
        if done >= 6 * MiB:
            cancel.set()

    stage = tmp_path / "stage"
    options = _options(plain_http=True, cancel=cancel, progress=progress, staging_dir=stage,
                       checkpoint_seconds=0.0, concurrency=2)  # fmt: skip
    planned = plan(_source(registry, "team/resume", "1.0"), options)  # type: ignore[arg-type]
    with pytest.raises(DownloadCancelled):
        download(planned, tmp_path / "model", options)
    assert (stage / ".praesto-journal").exists() and not (tmp_path / "model").exists()
    again = _options(plain_http=True, staging_dir=stage)
    result = download(planned, tmp_path / "model", again)
    assert (tmp_path / "model" / "model.bin").read_bytes() == big
    assert result.bytes_resumed >= 4 * MiB
    in_flight = 2 * MiB  # the cancelled run's parts on the wire when it stopped (concurrency 2 x 1 MiB)
    assert registry.blob_bytes("team/resume") <= len(big) + len(CONFIG) + in_flight  # both runs together


def test_a_blob_whose_bytes_changed_in_the_registry_is_refused_by_its_digest(
    registry: Registry, tmp_path: Path
) -> None:
    """The registry's storage is altered under a manifest (a tampered or rotten blob): the
    bytes no longer hash to the digest the manifest names, and nothing is published."""
    push_modelpack(registry, "team/rotten", "1.0", [Layer("model.bin", WEIGHTS)], tmp_path / "push")
    digest = hashlib.sha256(WEIGHTS).hexdigest()
    data = registry.workdir / "storage/docker/registry/v2/blobs/sha256" / digest[:2] / digest / "data"
    with data.open("r+b") as handle:  # the same size, one byte different
        handle.seek(len(WEIGHTS) // 2)
        handle.write(bytes([WEIGHTS[len(WEIGHTS) // 2] ^ 0xFF]))
    with pytest.raises(DownloadError, match="sha256") as refused:
        _fetch(registry, "team/rotten", "1.0", tmp_path / "model")
    assert "model.bin" in str(refused.value)
    assert not (tmp_path / "model").exists()
