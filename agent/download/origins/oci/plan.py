"""Resolve an OCI source (oci://host/repo:tag or @sha256:...) to a Plan of verified blobs.

The tag is resolved once, to the digest of what it points at (a manifest, or an image
index holding the model's manifest), and that digest is the plan's revision: the hooks
pin late nodes to it like a Hub commit. Every manifest read is checked against its
digest (sha256 of the bytes, as the distribution spec defines it). Raw layers become
files of the model, fetched by the same engine as Hub and object-store files (ranged,
resumable, deduplicated by sha256, from peers first, behind the origin budget); archive
layers are fetched whole into staging, verified, and unpacked (unpack.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from huggingface_hub.utils._paths import filter_repo_objects
from praesto.agent.download.api import (
    SUMMARY,
    Archive,
    DownloadError,
    LastingDownloadError,
    Options,
    Plan,
    RemoteFile,
    TemporaryDownloadError,
)
from praesto.agent.download.http import Transient
from praesto.agent.download.origins.oci.media import (
    ACCEPT,
    INDEXES,
    MODELPACK_ARTIFACT,
    LayerMeaning,
    meaning,
)
from praesto.agent.download.origins.oci.registry import Endpoint, RegistryTransport, endpoints, transport_for
from praesto.agent.download.repopath import RESERVED_PREFIX, check_repo_path

from praesto import names
from praesto.ocireference import DIGEST, Reference, reference_of
from praesto.spec import Source

log = logging.getLogger("praesto.download")
MAX_MANIFEST_BYTES = 4 << 20  # what containerd reads of a manifest at most (remotes/docker: 4 MiB)
ARCHIVE_DIR = f"{RESERVED_PREFIX}-layers"  # where archive layers wait in staging to be unpacked


def plan(source: Source, options: Options) -> Plan:
    """The digest `source.revision` names and every layer to fetch (after patterns)."""
    ref = reference_of(source.location, source.revision)
    tried = endpoints(ref, options)
    for endpoint in tried:
        transport = transport_for(endpoint, ref, options)
        try:
            return _plan_at(source, ref, endpoint, transport)
        except DownloadError as error:
            if not endpoint.mirror:
                raise
            log.warning(
                "mirror %s could not serve %s (%s); trying the next", endpoint.base, ref, error.reason
            )
        finally:
            transport.close()
    raise AssertionError(f"unreachable: {tried}")  # the registry itself is always the last endpoint


def _plan_at(source: Source, ref: Reference, endpoint: Endpoint, transport: RegistryTransport) -> Plan:
    body, media = fetch_manifest(transport, endpoint, ref, ref.revision)
    revision = "sha256:" + hashlib.sha256(body).hexdigest()
    manifest = _json(body, ref, revision)
    if media in INDEXES or manifest.get("mediaType") in INDEXES:
        chosen = _choose(manifest, ref, revision)
        child, _ = fetch_manifest(transport, endpoint, ref, chosen)
        manifest = _json(child, ref, chosen)
    files = _files(manifest, ref, endpoint, source)
    log.info(
        "planned source=%s revision=%s layers=%d at=%s",
        source.uri, revision, len(files), endpoint.base, extra=SUMMARY,
    )  # fmt: skip
    return Plan(source=source, revision=revision, files=files)


def fetch_manifest(
    transport: RegistryTransport, endpoint: Endpoint, ref: Reference, reference: str
) -> tuple[bytes, str]:
    """(bytes, media type) of one manifest or index; bytes checked against a digest reference."""
    url = endpoint.url(ref.repository, "manifests", reference)
    try:
        resp = transport.request("GET", url, authorized=True, headers={"Accept": ACCEPT})
        body = resp.read(MAX_MANIFEST_BYTES + 1)
    except Transient as error:
        if "CERTIFICATE_VERIFY_FAILED" in str(error):  # does not pass by itself: say what to trust
            raise LastingDownloadError(
                "SourceUnavailable",
                f"{ref}: {endpoint.base} presents a TLS certificate this node does not trust; add its CA to the "
                f"chart's downloads.caBundle (the CLI: {names.ENV_CA_BUNDLE})",
            ) from None
        raise TemporaryDownloadError("SourceUnavailable", f"{ref}: {error}; it will be retried") from None
    if resp.status != 200:
        raise _refusal(resp.status, body, ref, reference, transport)
    if len(body) > MAX_MANIFEST_BYTES:
        raise LastingDownloadError(
            "InvalidRepoFile", f"{ref}: the manifest is larger than 4 MiB; not a model"
        )
    got = "sha256:" + hashlib.sha256(body).hexdigest()
    if DIGEST.match(reference) and got != reference:
        raise LastingDownloadError(
            "ChecksumMismatch",
            f"{ref}: {endpoint.base} served a manifest whose digest is {got}, not {reference}",
        )
    said = resp.getheader("Docker-Content-Digest", "")
    if said.startswith("sha256:") and said != got:
        raise LastingDownloadError(
            "ChecksumMismatch", f"{ref}: the registry says the manifest is {said} but its bytes are {got}"
        )
    return body, resp.getheader("Content-Type", "").split(";")[0].strip()


def _refusal(
    status: int, body: bytes, ref: Reference, reference: str, transport: RegistryTransport
) -> DownloadError:
    codes = _error_codes(body)
    if status == 401 or (status == 403 and "DENIED" in codes):
        credential = transport.auth.credential
        if credential is None:
            return LastingDownloadError(
                "WaitingForCredentials",
                f"{ref} refused anonymous access (HTTP {status}); set spec.source.secretRef to a "
                "kubernetes.io/dockerconfigjson Secret with a login for "
                f"{ref.host} (the CLI: --registry-config)",
            )
        return LastingDownloadError(
            "Unauthorized",
            f"{ref}: HTTP {status} with the login from {credential.origin}; check the user, the password "
            "and their pull access to this repository",
        )
    if status == 404:
        if "NAME_UNKNOWN" in codes:
            return LastingDownloadError(
                "RepoNotFound", f"{ref}: the registry has no repository {ref.repository!r}; check the name"
            )
        return LastingDownloadError(
            "RevisionNotFound",
            f"{ref}: the repository has no {'manifest ' + reference if DIGEST.match(reference) else 'tag ' + repr(reference)}; "
            "check the tag or digest",
        )
    if status == 429 or status >= 500:
        return TemporaryDownloadError("SourceUnavailable", f"{ref}: the registry answered HTTP {status}")
    return LastingDownloadError(
        "SourceUnavailable",
        f"{ref}: the registry answered HTTP {status} ({', '.join(codes) or 'no error code'})",
    )


def _error_codes(body: bytes) -> list[str]:
    try:
        errors = json.loads(body).get("errors", [])
        return [str(e.get("code")) for e in errors if isinstance(e, dict)]
    except (ValueError, AttributeError):
        return []


def _json(body: bytes, ref: Reference, digest: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise LastingDownloadError("InvalidRepoFile", f"{ref}: manifest {digest} is not a JSON object")
    return data


def _choose(index: Mapping[str, Any], ref: Reference, digest: str) -> str:
    """The one manifest of an index that is a model: the only one, or the only ModelPack one."""
    entries = [
        m for m in index.get("manifests") or [] if isinstance(m, dict) and DIGEST.match(str(m.get("digest")))
    ]
    models = [m for m in entries if m.get("artifactType") == MODELPACK_ARTIFACT]
    chosen = entries if len(entries) == 1 else models
    if len(chosen) == 1:
        return str(chosen[0]["digest"])
    listed = (
        ", ".join(f"{m['digest']} ({m.get('artifactType') or _platform(m)})" for m in entries[:5]) or "none"
    )
    raise LastingDownloadError(
        "InvalidRepoFile",
        f"{ref}: the index {digest} holds {len(entries)} manifests and {len(models)} are ModelPack models: "
        f"{listed}; reference the one to cache by digest ({ref.location}@sha256:...)",
    )


def _platform(entry: Mapping[str, Any]) -> str:
    platform = entry.get("platform")
    if isinstance(platform, dict):
        return f"{platform.get('os', '?')}/{platform.get('architecture', '?')}"
    return "no artifactType"


def _files(
    manifest: Mapping[str, Any], ref: Reference, endpoint: Endpoint, source: Source
) -> tuple[RemoteFile, ...]:
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        raise LastingDownloadError("InvalidRepoFile", f"{ref}: the manifest has no layers; nothing to cache")
    described: list[tuple[LayerMeaning, Mapping[str, Any]]] = []
    for number, layer in enumerate(layers, 1):
        means = meaning(layer) if isinstance(layer, dict) else None
        if means is None:
            raise LastingDownloadError(
                "InvalidRepoFile",
                f"{ref}: layer {number} names no file (no org.cncf.model.filepath or "
                "org.opencontainers.image.title annotation): a container image, not a model artifact; "
                "push the model with a ModelPack tool (modctl, KitOps) or oras push",
            )
        check_repo_path(means.path.strip("/") if means.archive else means.path)
        described.append((means, layer))
    chosen = filter_repo_objects(
        described,
        allow_patterns=list(source.allow_patterns) or None,
        ignore_patterns=list(source.ignore_patterns) or None,
        key=lambda item: item[0].path,
    )
    files: dict[str, RemoteFile] = {}
    for means, layer in chosen:
        digest, size = str(layer.get("digest", "")), layer.get("size")
        if not DIGEST.match(digest) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise LastingDownloadError(
                "InvalidRepoFile",
                f"{ref}: layer {means.path!r} has digest {digest!r} and size {size!r}; only sha256 layers "
                "with a size are cached",
            )
        hex_ = digest.removeprefix("sha256:")
        url = endpoint.url(ref.repository, "blobs", digest)
        if means.archive is None:
            file = RemoteFile(means.path, size, sha256=hex_, key=url)
        else:
            # What it says it unpacks to (None: unknown, the copy's bound counts: Plan.disk_bytes);
            # an uncompressed tar holds no more than itself, whatever its metadata says.
            claims = [
                c for c in (means.metadata_size, size if means.archive == "tar" else None) if c is not None
            ]
            archive = Archive(means.archive, means.path, min(claims, default=None))
            file = RemoteFile(f"{ARCHIVE_DIR}/{hex_}", size, sha256=hex_, key=url, archive=archive)
        if file.path in files and file.archive is None:
            raise LastingDownloadError(
                "InvalidRepoFile", f"{ref}: two layers are both named {means.path!r}; one file per path"
            )
        files[file.path] = file
    if not files:
        raise LastingDownloadError(
            "RepoNotFound", f"{ref}: no layer matches allowPatterns/ignorePatterns; check the patterns"
        )
    return tuple(sorted(files.values(), key=lambda f: f.path))
