"""What an OCI manifest's layers mean for a model: a file, an archive of files, or neither.

Two artifact shapes are read:
* ModelPack (CNCF, github.com/modelpack/model-spec, docs/spec.md and docs/annotations.md):
  `artifactType` `application/vnd.cncf.model.manifest.v1+json`, layers
  `application/vnd.cncf.model.<kind>.v1.<raw|tar|tar+gzip|tar+zstd>` where kind is
  `weight`, `weight.config`, `doc`, `code` (and whatever later kinds follow the pattern),
  the file's path in `org.cncf.model.filepath`, its metadata (size among it) in
  `org.cncf.model.file.metadata+json`;
* `oras push` artifacts (oras-go v2 `content/file`): one file per layer, named by
  `org.opencontainers.image.title`, whatever its media type; a pushed folder is a
  tar+gzip layer marked `io.deis.oras.content.unpack: "true"`.
A layer with neither name (a container image's filesystem layer) is refused: a model cache
does not unpack container images.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

MANIFEST_OCI = "application/vnd.oci.image.manifest.v1+json"
INDEX_OCI = "application/vnd.oci.image.index.v1+json"
MANIFEST_DOCKER = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_DOCKER = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFESTS = (MANIFEST_OCI, MANIFEST_DOCKER)
INDEXES = (INDEX_OCI, INDEX_DOCKER)
ACCEPT = ", ".join((*MANIFESTS, *INDEXES))

MODELPACK_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODELPACK_CONFIG = "application/vnd.cncf.model.config.v1+json"
MODELPACK_LAYER = re.compile(r"^application/vnd\.cncf\.model\.([a-z.]+)\.v1\.(raw|tar|tar\+gzip|tar\+zstd)$")
ANNOTATION_FILEPATH = "org.cncf.model.filepath"
ANNOTATION_FILE_METADATA = "org.cncf.model.file.metadata+json"
ANNOTATION_TITLE = "org.opencontainers.image.title"
ANNOTATION_ORAS_UNPACK = "io.deis.oras.content.unpack"
ORAS_FOLDER_KIND = "tar+gzip"  # oras-go packs a pushed folder as a gzip'd tar
RAW = "raw"


@dataclass(frozen=True)
class LayerMeaning:
    path: str  # where its content goes in the model (a file, or the folder/file an archive holds)
    archive: str | None  # None: the layer is the file; else how to unpack it (api.ARCHIVE_KINDS)
    metadata_size: int | None  # ModelPack: the file's size from its metadata annotation


def is_modelpack(manifest: Mapping[str, object]) -> bool:
    config = manifest.get("config")
    config_type = config.get("mediaType") if isinstance(config, Mapping) else None
    return manifest.get("artifactType") == MODELPACK_ARTIFACT or config_type == MODELPACK_CONFIG


def meaning(layer: Mapping[str, object]) -> LayerMeaning | None:
    """How a layer lands in the model; None when it names no file (not a model's layer)."""
    media = str(layer.get("mediaType") or "")
    raw_annotations = layer.get("annotations")
    annotations: Mapping[str, object] = raw_annotations if isinstance(raw_annotations, Mapping) else {}
    modelpack = MODELPACK_LAYER.match(media)
    if modelpack:
        path = annotations.get(ANNOTATION_FILEPATH) or annotations.get(ANNOTATION_TITLE)
        if not isinstance(path, str) or not path:
            return None
        kind = modelpack.group(2)
        return LayerMeaning(path, None if kind == RAW else kind, _metadata_size(annotations))
    title = annotations.get(ANNOTATION_TITLE)
    if not isinstance(title, str) or not title:
        return None
    unpack = str(annotations.get(ANNOTATION_ORAS_UNPACK, "")).lower() == "true"
    return LayerMeaning(title, ORAS_FOLDER_KIND if unpack else None, None)


def _metadata_size(annotations: Mapping[str, object]) -> int | None:
    text = annotations.get(ANNOTATION_FILE_METADATA)
    if not isinstance(text, str):
        return None
    try:
        size = json.loads(text).get("size")
    except (ValueError, AttributeError):
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
