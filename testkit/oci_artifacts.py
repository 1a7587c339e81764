"""Model artifacts pushed to the tests' registry through the ORAS CLI, the way publishers push them.

* `push_files`: plain `oras push` (one file per layer, named by `org.opencontainers.image.title`;
  a folder becomes one tar+gzip layer marked for unpacking, as oras-go's file store makes it).
* `push_modelpack`: a CNCF ModelPack artifact (modelpack/model-spec docs/spec.md,
  docs/annotations.md): `artifactType` and config of the model spec, each layer
  `application/vnd.cncf.model.<kind>.v1.<raw|tar|tar+gzip|tar+zstd>` with
  `org.cncf.model.filepath` and `org.cncf.model.file.metadata+json`; a tar layer holds its one
  file under that path, as `modctl build` packs it.
* `index`: an image index over manifests already pushed (`oras manifest index create`).
"""

from __future__ import annotations

import gzip
import io
import json
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import zstandard
from praesto.agent.download.origins.oci.media import (
    ANNOTATION_FILE_METADATA,
    ANNOTATION_FILEPATH,
    MODELPACK_ARTIFACT,
    MODELPACK_CONFIG,
)

from testkit.registry import Registry

_DIGEST = re.compile(r"Digest: (sha256:[0-9a-f]{64})")
# oras stamps the push time (seconds) unless told: the same artifact pushed to two registries must
# have one digest, even when the pushes straddle a second (a mirror test failed in CI on it).
_REPRODUCIBLE = {"org.opencontainers.image.created": "2026-01-01T00:00:00Z"}


@dataclass(frozen=True)
class Layer:
    path: str  # the model file it carries (org.cncf.model.filepath)
    data: bytes
    packing: str = "raw"  # raw, tar, tar+gzip, tar+zstd
    kind: str = "weight"  # weight, weight.config, doc, code
    blob: bytes | None = None  # the layer's bytes as pushed, when not built from `data` (hostile archives)
    size_claim: int | None = None  # the metadata's size, when it should lie
    metadata: bool = True  # False: the layer carries no org.cncf.model.file.metadata+json annotation

    @property
    def media_type(self) -> str:
        return f"application/vnd.cncf.model.{self.kind}.v1.{self.packing}"


def digest_of(oras_output: str) -> str:
    found = _DIGEST.search(oras_output)
    assert found, oras_output
    return found.group(1)


def push_files(
    registry: Registry, repository: str, tag: str, files: dict[str, bytes], workdir: Path,
    user: tuple[str, str] | None = None, folders: tuple[str, ...] = (),
) -> str:  # fmt: skip
    """`oras push` of `files` (relative paths) and whole `folders` of them; the manifest digest."""
    workdir.mkdir(parents=True, exist_ok=True)
    for path, data in files.items():
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).write_bytes(data)
    loose = [p for p in files if not any(p.startswith(f"{f}/") for f in folders)]
    out = registry.oras("push", registry.reference(repository, tag), *loose, *folders, cwd=workdir, user=user)
    return digest_of(out)


def archive(path: str, data: bytes, packing: str) -> bytes:
    """A tar holding `data` at `path` (modctl's layout), compressed as `packing` says."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(path)
        info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
        tar.addfile(info, io.BytesIO(data))
    raw = out.getvalue()
    if packing == "tar+gzip":
        return gzip.compress(raw, mtime=0)
    if packing == "tar+zstd":
        return zstandard.ZstdCompressor().compress(raw)
    return raw


def _metadata(layer: Layer) -> str:
    size = layer.size_claim if layer.size_claim is not None else len(layer.data)
    return json.dumps({"name": layer.path.rsplit("/", 1)[-1], "mode": 0o644, "uid": 0, "gid": 0, "size": size,
                       "mtime": "2026-01-01T00:00:00Z", "typeflag": 48})  # fmt: skip


def push_modelpack(
    registry: Registry, repository: str, tag: str, layers: list[Layer], workdir: Path,
    user: tuple[str, str] | None = None,
) -> str:  # fmt: skip
    """A ModelPack artifact of `layers`; the manifest digest."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = {"descriptor": {"name": repository, "version": tag}, "config": {"format": "safetensors"},
              "modelfs": {"type": "layers", "diffIds": []}}  # fmt: skip
    (workdir / "config.json").write_text(json.dumps(config))
    annotations: dict[str, dict[str, str]] = {
        "$manifest": {"org.cncf.model.name": repository, **_REPRODUCIBLE}
    }
    args = []
    for number, layer in enumerate(layers):
        blob = layer.blob if layer.blob is not None else (
            layer.data if layer.packing == "raw" else archive(layer.path, layer.data, layer.packing)
        )  # fmt: skip
        name = f"layer-{number}.{layer.packing.replace('+', '.')}"  # the blob file; its title
        (workdir / name).write_bytes(blob)
        annotations[name] = {ANNOTATION_FILEPATH: layer.path}
        if layer.metadata:
            annotations[name][ANNOTATION_FILE_METADATA] = _metadata(layer)
        args.append(f"{name}:{layer.media_type}")
    (workdir / "annotations.json").write_text(json.dumps(annotations))
    out = registry.oras(
        "push", registry.reference(repository, tag), *args,
        "--artifact-type", MODELPACK_ARTIFACT, "--config", f"config.json:{MODELPACK_CONFIG}",
        "--annotation-file", "annotations.json", cwd=workdir, user=user,
    )  # fmt: skip
    return digest_of(out)


def index(
    registry: Registry, repository: str, tag: str, *manifests: str, user: tuple[str, str] | None = None
) -> str:
    """An image index tagged `tag` over manifests (digests or tags) of the same repository."""
    out = registry.oras(
        "manifest", "index", "create", registry.reference(repository, tag), *manifests, user=user
    )
    return digest_of(out)
