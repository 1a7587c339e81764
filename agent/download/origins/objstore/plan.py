"""Resolve an object-store source (s3://, gs://, az://) to a Plan: every object, pinned.

One library for all stores: `obstore`. The listing gives each object's size and ETag;
when the bucket keeps versions, a HEAD per object adds the version id (the first HEAD
tells whether it does). The revision is a sha256 over (path, size, ETag, version) of
every selected object, so status names exactly what was cached, and the fetch pins each
object (If-Match on the ETag, the version when there is one): an object replaced
mid-download is noticed, never mixed in. Object stores list no sha256: a single-part S3
ETag is the content MD5; every other object gets the store's own checksum from a HEAD
(`storesums`). Either is verified; sha256 is computed and kept in the manifest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import obstore
from huggingface_hub.utils._paths import filter_repo_objects
from obstore.exceptions import (
    BaseError,
    InvalidPathError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import AzureStore, GCSStore, S3Store
from praesto.agent.download.api import (
    SUMMARY,
    DownloadError,
    LastingDownloadError,
    Options,
    Plan,
    RemoteFile,
    TemporaryDownloadError,
    check_file_count,
)
from praesto.agent.download.digests import StoreDigest
from praesto.agent.download.egress import REASON_EGRESS_REFUSED, EgressRefused
from praesto.agent.download.origins.objstore.creds import StoreConfig, store_config
from praesto.agent.download.origins.objstore.storesums import with_store_digests
from praesto.agent.download.repopath import check_repo_path

from praesto.spec import Source

log = logging.getLogger("praesto.download")
Store = S3Store | GCSStore | AzureStore
T = TypeVar("T")
HEAD_CONCURRENCY = 16
# obstore raises its own errors, and builtin ones for some (NotFound is a FileNotFoundError)
STORE_ERRORS = (BaseError, OSError)
_MD5 = re.compile(r"^[0-9a-f]{32}$")
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
_STATUS = re.compile(r"status code: (\d{3})")
_BAD_KEY = re.compile(r'path: "((?:[^"\\]|\\.)*)"')  # object_store's InvalidPath, as Rust's Debug prints it
MISSING_BUCKET = ("NoSuchBucket", "ContainerNotFound")
REFUSED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "AuthenticationFailed",
           "AuthorizationFailure", "InvalidAuthenticationInfo", "ExpiredToken")  # fmt: skip


def split(source: Source) -> tuple[str, str]:
    """(bucket, prefix) of s3://bucket/prefix; the prefix has no trailing slash."""
    bucket, _, prefix = source.location.partition("/")
    return bucket, prefix.strip("/")


def config_for(source: Source, options: Options) -> StoreConfig:
    """The store's settings, with every URL they name checked under the egress rule first."""
    bucket, _ = split(source)
    cfg = store_config(
        source.scheme,
        bucket,
        options.credentials or {},
        options.store_environment.as_dict(),
        options.credentials_from,
        identity_allowed=options.identity_allowed,
    )
    for url in cfg.contacts:
        try:
            options.egress.check_url(url)
        except EgressRefused as refused:
            raise LastingDownloadError(REASON_EGRESS_REFUSED, f"{source.uri}: {refused}") from None
    return cfg


def open_store(cfg: StoreConfig) -> Store:
    kwargs: dict[str, Any] = {
        "config": cfg.config,
        "client_options": cfg.client_options,
        "retry_config": cfg.retry,
    }
    if cfg.scheme == "s3":
        return S3Store(cfg.bucket, **kwargs)
    if cfg.scheme == "gs":
        return GCSStore(cfg.bucket, **kwargs)
    return AzureStore(cfg.bucket, **kwargs)


def store_call(fn: Callable[[], T], uri: str, cfg: StoreConfig, what: str) -> T:
    """Run one store call; every store error becomes a DownloadError naming cause and fix."""
    try:
        return fn()
    except STORE_ERRORS as error:
        raise translate(error, uri, cfg, what) from None


def translate(error: Exception, uri: str, cfg: StoreConfig, what: str) -> DownloadError:
    """Store errors as condition reasons. The text quoted is the store's error code only:
    never the raw message (it may carry a signed URL)."""
    text = str(error)
    if isinstance(error, InvalidPathError):
        return unsafe_key(text, uri)
    code_match = _CODE.search(text)
    code = code_match.group(1) if code_match else ""
    status_match = _STATUS.search(text)
    status = int(status_match.group(1)) if status_match else 0
    detail = f" ({code or type(error).__name__}{f', HTTP {status}' if status else ''})"
    if code in MISSING_BUCKET or (status == 404 and what == "listing"):
        return LastingDownloadError(
            "RepoNotFound",
            f"{uri}: the bucket {cfg.bucket!r} does not exist{detail}; check the bucket name and the endpoint",
        )
    refused = (
        isinstance(error, PermissionDeniedError | UnauthenticatedError | PermissionError) or code in REFUSED
    )
    if refused or status in (401, 403):
        if not cfg.credentialed:
            return LastingDownloadError(
                "WaitingForCredentials",
                f"{uri} refused anonymous access{detail} and no credential is configured; set "
                "spec.source.secretRef on the ModelCache, or credentials.secretRef / credentials.identity "
                "in the chart values (they serve only the namespaces in credentials.namespaces)",
            )
        return LastingDownloadError(
            "Unauthorized",
            f"{uri}: {what} refused with the credentials from {cfg.described}{detail}; check the key "
            "and that it may read the bucket",
        )
    if isinstance(error, PreconditionError):
        return TemporaryDownloadError(
            "SourceUnavailable", f"{uri}: an object changed while it was downloaded; it will be planned again",
        )  # fmt: skip
    if isinstance(error, NotFoundError | FileNotFoundError):
        return TemporaryDownloadError(
            "SourceUnavailable", f"{uri}: an object vanished during {what}; it will be planned again",
        )  # fmt: skip
    return TemporaryDownloadError("SourceUnavailable", f"{uri}: {what} failed{detail}; it will be retried")


def unsafe_key(text: str, uri: str) -> LastingDownloadError:
    """A key with `..`, `.` or empty segments (`a//b`): obstore's listing refuses to parse it, before
    check_repo_path sees it. The bucket holds it until someone renames it, so the copy fails for good
    naming the key (never retried as a store outage)."""
    found = _BAD_KEY.search(text)
    key = re.sub(r"\\(.)", r"\1", found.group(1)) if found else "?"
    return LastingDownloadError(
        "InvalidRepoFile",
        f"{uri}: object {key!r} would escape the destination ('..', '.' or an empty segment); remove or "
        "rename it in the bucket (plain relative names only)",
    )


def plan(source: Source, options: Options) -> Plan:
    """Every object under the prefix (after patterns), pinned by ETag and version."""
    cfg = config_for(source, options)
    store = open_store(cfg)
    _, prefix = split(source)
    metas = store_call(lambda: _list(store, prefix), source.uri, cfg, "listing")
    if not metas and prefix:  # s3://bucket/path/to/one-object
        head = store_call(lambda: _head_or_none(store, prefix), source.uri, cfg, "listing")
        if head is not None:
            metas = [(prefix.rsplit("/", 1)[-1], head)]
    if not metas:
        raise LastingDownloadError(
            "RepoNotFound",
            f"{source.uri}: no object at or under this prefix; check the prefix (it is case-sensitive)",
        )
    chosen = _select(metas, source)
    check_file_count(source.uri, len(chosen), options.max_files, "point the URI at a prefix holding fewer")
    if chosen and chosen[0][1].get("version") is None:
        chosen = _with_versions(store, chosen, source.uri, cfg)
    files = tuple(sorted((_remote(path, meta, cfg.etag_md5) for path, meta in chosen), key=lambda f: f.path))
    files = with_store_digests(store, cfg, files, options.ca_bundle, options.proxies, options.egress)
    revision = revision_of(files)
    log.info("planned source=%s revision=%s files=%d", source.uri, revision, len(files), extra=SUMMARY)
    return Plan(source=source, revision=revision, files=files)


def revision_of(files: Iterable[RemoteFile]) -> str:
    listing = [[f.path, f.size, f.etag, f.version] for f in files]
    return hashlib.sha256(json.dumps(listing, separators=(",", ":")).encode()).hexdigest()


def _list(store: Store, prefix: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in obstore.list(store, prefix=prefix or None, chunk_size=1000):
        for meta in chunk:
            key = str(meta["path"])
            rel = key[len(prefix) + 1 :] if prefix else key
            if rel and not rel.endswith("/"):  # "folder" marker objects are not files
                out.append((rel, dict(meta)))
    return out


def _head_or_none(store: Store, key: str) -> dict[str, Any] | None:
    try:
        return dict(obstore.head(store, key))
    except (NotFoundError, FileNotFoundError):
        return None


def _select(metas: list[tuple[str, dict[str, Any]]], source: Source) -> list[tuple[str, dict[str, Any]]]:
    chosen = filter_repo_objects(
        metas,
        allow_patterns=list(source.allow_patterns) or None,
        ignore_patterns=list(source.ignore_patterns) or None,
        key=lambda m: m[0],
    )
    return [(check_repo_path(path), meta) for path, meta in chosen]


def _with_versions(
    store: Store, chosen: list[tuple[str, dict[str, Any]]], uri: str, cfg: StoreConfig
) -> list[tuple[str, dict[str, Any]]]:
    """Listings carry no version ids: HEAD the objects, unless the first shows none are kept."""

    def head(item: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        path, meta = item
        got = store_call(lambda: dict(obstore.head(store, str(meta["path"]))), uri, cfg, "HEAD")
        return path, {**meta, "version": got.get("version"), "e_tag": got.get("e_tag") or meta.get("e_tag")}

    first = head(chosen[0])
    if first[1].get("version") is None:
        return chosen
    with ThreadPoolExecutor(HEAD_CONCURRENCY, thread_name_prefix="praesto-head") as pool:
        return [first, *pool.map(head, chosen[1:])]


def _remote(path: str, meta: dict[str, Any], etag_md5: bool) -> RemoteFile:
    etag = meta.get("e_tag")
    plain = etag.strip('"').lower() if isinstance(etag, str) else ""
    md5 = StoreDigest("md5", plain, "ETag") if etag_md5 and _MD5.match(plain) else None  # multipart: "-N"
    version = meta.get("version")
    return RemoteFile(
        path, int(meta["size"]), digest=md5, etag=etag if isinstance(etag, str) else None,
        version=str(version) if version else None, key=str(meta["path"]),
    )  # fmt: skip
