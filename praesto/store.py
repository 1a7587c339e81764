"""The node-local store: where things live under the base path, and the small
files through which the CSI driver and the node agent talk.

Layout (`<base>` is the base path, `<ns>`/`<name>` a namespace and cache name,
both DNS labels, so they never contain `_` or start with `.`):

    <base>/<ns>/<name>/                 published cache: model files + marker files
    <base>/.praesto/staging/<ns>_<name>/  download in progress (same filesystem)
    <base>/.praesto/blobs/sha256/<hex>  content-addressed copies (hard links) for dedup
    <base>/.praesto/blobs/xet/          Xet chunks by hash, and each verified file's chunk list
    <base>/.praesto/mounts/<id>.json    CSI mount records: a cache with one is in use
    <base>/.praesto/used/<ns>_<name>    mtime = last unmount (lastUsedTime)
    <base>/.praesto/requests/<ns>_<name>.json   CSI asks the agent to (re)hydrate
    <base>/.praesto/progress/<ns>_<name>.json   agent tells the CSI driver how far it got
    <base>/.praesto/pods/<hash>.json    CSI: when a Pod first asked for a cache and got it (praesto.coldstart_record)
    <base>/.praesto/copies/<ns>_<name>.json     agent: where the bytes of the current copy came from
    <base>/.praesto/scrub/<ns>_<name>.json      agent: when the copy was last scrubbed, and how it went
    <base>/.praesto/next/<ns>_<name>/           agent: a new revision fetched beside the served copy
    <base>/.praesto/retired/<ns>_<name>/<commit>/  agent: a copy a revision switch took out of
                                                service, kept while a mount record names its commit
        .../<commit>/.praesto-retiring           its complete marker, set aside while its mounts are read
    <base>/.praesto/agent.lock          agent: held while an agent runs on this base path

This module is the one owner of these names: the agent, eviction, scrub and the CSI driver's
`praesto.csi.storefs` ask it and never spell one; tests/test_store_layout.py guards them literally.

A revision switch renames the served copy into `retired` and the `next` copy onto the
cache directory (one filesystem, so a running Pod's bind mount keeps the inode it has);
mount records carry the commit they mounted, which says when a retired copy may go.

The agent is the only writer of cache directories, staging, blobs, progress and
copy records; the CSI driver is the only writer of mount records, `used` stamps,
requests and pod-start records,
which it writes through `praesto.csi.storefs` (directory fds, no symlink followed:
it runs as root, the agent does not); this module holds the layout, the record
shapes, the agent's readers and the agent's own writers, and no writer of the
driver's files (tests write those through `CsiStore` too). The agent may remove answered requests,
reported pod-start records and a deleted cache's `used` stamp, and holds `.praesto/agent.lock` while it runs.
Every write is a whole-file atomic replace, so a reader never sees half a record.
Over ~400 lines on purpose: one owner of every name above (issue 39 item 4); the copy checks
(`copy_mismatch`, `signature_mismatch`) are the piece to move out if it grows further.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from praesto import names

INTERNAL_DIR = ".praesto"
# below INTERNAL_DIR: the agent's own directories
STAGING = "staging"
BLOBS = "blobs"
BLOB_ALGORITHM = "sha256"  # blobs/sha256/<hex>
BLOB_ORIGIN_INDEX = "by-origin"  # blobs/sha256/by-origin/<origin key>: the sha256 verified for it
BLOB_SHARING_PREFIX = ".sharing-"  # a blob's passing second name while dedup links it (gc drops strays)
XET_CHUNKS = "xet"  # blobs/xet/: the Xet chunk store, beside blobs/sha256 (agent/download/.../xetstore.py)
XET_CHUNK_DATA = "chunks"  # blobs/xet/chunks/<2 hex>/<chunk hash>: one chunk as a xorb stores it
XET_FILE_INDEX = "files"  # blobs/xet/files/<CAS key>/<xorb>/<file sha256>: a verified file's chunks of a xorb
PROGRESS = "progress"
COPIES = "copies"
SCRUB = "scrub"
NEXT = names.STORE_NEXT_DIR
RETIRED = names.STORE_RETIRED_DIR
RETIRING = ".praesto-retiring"  # in a retired copy: its complete marker, set aside while its mounts are read
LOCK_FILE = "agent.lock"
# below INTERNAL_DIR: the CSI driver's directories (it writes them through praesto.csi.storefs)
MOUNTS = "mounts"
USED = "used"
REQUESTS = "requests"
PODS = "pods"
RECORD_SUFFIX = ".json"
TEMP_PREFIX = ".tmp-"  # a record being written: never read as one


def xet_chunks_beside(blobs_dir: Path) -> Path:
    """The Xet chunk store beside a blob store (a download knows only its blob directory)."""
    return blobs_dir.parent / XET_CHUNKS


def cache_key(namespace: str, name: str) -> str:
    return f"{namespace}_{name}"


def copy_owner(parts: Sequence[str]) -> tuple[str, str] | None:
    """(namespace, cache) whose copy is at `<base>/<parts...>`: its cache directory or one of its
    retired copies (`.praesto/retired/<ns>_<name>/<commit>`); None for any other path."""
    if len(parts) == 2 and all(names.is_dns_label(p) for p in parts):
        return parts[0], parts[1]
    if len(parts) == 4 and (parts[0], parts[1]) == (INTERNAL_DIR, RETIRED):
        namespace, _, name = parts[2].partition("_")  # a DNS label holds no "_"
        if names.is_dns_label(namespace) and names.is_dns_label(name):
            return namespace, name
    return None


def record_name(namespace: str, name: str) -> str:
    """A cache's record file in requests/, progress/, copies/ and scrub/."""
    return cache_key(namespace, name) + RECORD_SUFFIX


def used_name(namespace: str, name: str) -> str:
    """A cache's stamp in used/ (its mtime is the last unmount)."""
    return cache_key(namespace, name)


def mount_record_name(volume_id: str) -> str:
    """A mount record's file: volume ids come from the kubelet ("csi-<hash>"); never trust them as paths."""
    return names.short_hash(volume_id, 32) + RECORD_SUFFIX


def is_record_name(file_name: str) -> bool:
    """A finished record's file (not one still being written under its temporary name)."""
    return file_name.endswith(RECORD_SUFFIX) and not file_name.startswith(TEMP_PREFIX)


def request_owner(file_name: str, data: dict[str, Any] | None) -> tuple[str, str] | None:
    """(namespace, cache) of a hydration request, None when malformed or filed under another name."""
    namespace, name = (data or {}).get("namespace"), (data or {}).get("name")
    if not (isinstance(namespace, str) and isinstance(name, str)):
        return None
    return (namespace, name) if file_name == record_name(namespace, name) else None


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON so readers see the old file or the new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with path.open() as handle:
            data = json.load(handle)
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class StoreLayout:
    base: Path

    @property
    def internal(self) -> Path:
        return self.base / INTERNAL_DIR

    def cache_dir(self, namespace: str, name: str) -> Path:
        return self.base / namespace / name

    def complete_marker(self, namespace: str, name: str) -> Path:
        return self.cache_dir(namespace, name) / names.COMPLETE_FILE

    def manifest_path(self, namespace: str, name: str) -> Path:
        return self.cache_dir(namespace, name) / names.MANIFEST_FILE

    def is_complete(self, namespace: str, name: str) -> bool:
        return self.complete_marker(namespace, name).is_file()

    @property
    def lock_file(self) -> Path:
        return self.internal / LOCK_FILE

    def staging_dir(self, namespace: str, name: str) -> Path:
        return self.internal / STAGING / cache_key(namespace, name)

    @property
    def blobs_dir(self) -> Path:
        return self.internal / BLOBS / BLOB_ALGORITHM

    @property
    def blob_origin_index(self) -> Path:
        return self.blobs_dir / BLOB_ORIGIN_INDEX

    @property
    def xet_chunks_dir(self) -> Path:
        return xet_chunks_beside(self.blobs_dir)

    @property
    def mounts_dir(self) -> Path:
        return self.internal / MOUNTS

    @property
    def used_dir(self) -> Path:
        return self.internal / USED

    def used_stamp(self, namespace: str, name: str) -> Path:
        return self.used_dir / used_name(namespace, name)

    @property
    def requests_dir(self) -> Path:
        return self.internal / REQUESTS

    def request_file(self, namespace: str, name: str) -> Path:
        return self.requests_dir / record_name(namespace, name)

    @property
    def progress_dir(self) -> Path:
        return self.internal / PROGRESS

    def progress_file(self, namespace: str, name: str) -> Path:
        return self.progress_dir / record_name(namespace, name)

    @property
    def pod_starts_dir(self) -> Path:
        return self.internal / PODS

    def next_dir(self, namespace: str, name: str) -> Path:
        """Where a new revision is published beside the served copy (rolling updates)."""
        return self.internal / NEXT / cache_key(namespace, name)

    def next_staging_dir(self, namespace: str, name: str) -> Path:
        """Staging of the copy beside: `.` never occurs in a DNS label, so no cache's staging is this."""
        return self.internal / STAGING / (cache_key(namespace, name) + "." + NEXT)

    def retired_root(self, namespace: str, name: str) -> Path:
        return self.internal / RETIRED / cache_key(namespace, name)

    def retired_dir(self, namespace: str, name: str, revision: str) -> Path:
        """A copy a switch took out of service, by the commit it holds (a 40-hex id or a digest)."""
        return self.retired_root(namespace, name) / revision.replace(":", "_").replace("/", "_")

    def copy_record(self, namespace: str, name: str) -> Path:
        return self.internal / COPIES / record_name(namespace, name)

    def scrub_record(self, namespace: str, name: str) -> Path:
        """The last scrub of a copy (agent/scrub/): survives agent restarts, so they do not rescrub all at once."""
        return self.internal / SCRUB / record_name(namespace, name)


@dataclass(frozen=True)
class RequiredSignature:
    """The signature spec.verification asks of a copy: how it was verified and under which trust.

    `trust` is the fingerprint of the trust material as the agent holds it now
    (agent/download/api.py `SignaturePolicy.trust`): a copy verified under other material (a key the
    platform replaced or withdrew) is not a copy of this cache any more. "" where it is not known
    without reading the API (a namespace Secret or ConfigMap, read only by a download attempt).
    """

    method: str
    path: str
    trust: str = ""
    origin: str = ""  # where the current trust comes from, for messages


# RequiredSignature.trust of a platform trust name the agent no longer holds: no copy was verified
# under it, so every copy that names it leaves Ready
TRUST_WITHDRAWN = "withdrawn"


def signature_mismatch(record: Any, wanted: RequiredSignature) -> str | None:
    """Why a manifest's signature record (names.MANIFEST_SIGNATURE) does not satisfy `wanted`, None
    when it does: the one comparison behind the reconcile's `copy_mismatch` and the download's
    `publish.is_published`, so a copy the download would fetch again is never served meanwhile."""
    how = (record.get("method"), record.get("path")) if isinstance(record, dict) else None
    if how != (wanted.method, wanted.path):
        return f"it was not verified by the {wanted.method} signature {wanted.path} that spec.verification requires"
    if wanted.trust and record.get("trust") != wanted.trust:
        now = "no trust (withdrawn)" if wanted.trust == TRUST_WITHDRAWN else wanted.trust
        return (
            f"it was verified under trust {record.get('trust')} from {record.get('trustFrom')}, and "
            f"{wanted.origin or 'spec.verification'} is now {now}: the key or CA was replaced or withdrawn"
        )
    return None


def copy_mismatch(
    manifest: dict[str, Any],
    *,
    source: str,
    revision: str,
    allow_patterns: tuple[str, ...],
    ignore_patterns: tuple[str, ...],
    cache_uid: str,
    signature: RequiredSignature | None = None,
) -> str | None:
    """Why a complete copy's manifest is not a copy of this cache (None when it is).

    A node away while its cache was deleted and created again under the same name (maybe with
    another source, maybe by another tenant) comes back to the old copy under the new cache's
    path: its completion marker proves only that it was complete for someone. `revision` may be
    the requested one (a branch) or the commit it resolved to; both are in the manifest. A copy
    without a cache UID (pre-baked by `praesto-agent download`) belongs to whichever cache has
    its source and revision. `signature` is what spec.verification requires, if anything: a copy
    must then have been verified that way and under the trust held now (`signature_mismatch`), so
    no unsigned copy, pre-baked or older, and no copy verified under withdrawn trust stands in
    for a cache that verifies.
    """
    if manifest.get("source") != source:
        return f"it holds source {manifest.get('source')!r}, not {source}"
    if revision and revision not in (manifest.get("revision"), manifest.get("resolvedRevision")):
        return f"it holds revision {manifest.get('resolvedRevision')!r} of {source}, not {revision}"
    patterns = (list(manifest.get("allowPatterns") or []), list(manifest.get("ignorePatterns") or []))
    if patterns != (list(allow_patterns), list(ignore_patterns)):
        return f"it was filtered by other allowPatterns/ignorePatterns {patterns}"
    owner = manifest.get(names.MANIFEST_CACHE_UID)
    if cache_uid and owner and owner != cache_uid:
        return f"it belongs to an earlier ModelCache of this name (UID {owner}, not {cache_uid})"
    if signature is not None:
        return signature_mismatch(manifest.get(names.MANIFEST_SIGNATURE), signature)
    return None


# ---- mount records (written by the CSI driver, read by the agent) ----------


@dataclass(frozen=True)
class MountRecord:
    volume_id: str
    namespace: str
    name: str
    target_path: str
    mounted_at: float
    revision: str = ""  # the commit of the copy mounted (its manifest's resolvedRevision); "" if unknown

    @property
    def file_name(self) -> str:
        return mount_record_name(self.volume_id)


def record_from(data: dict[str, Any] | None) -> MountRecord | None:
    """A mount record parsed from its JSON, None when malformed (shared with the CSI driver's reader)."""
    if not data:
        return None
    try:
        return MountRecord(
            str(data["volume_id"]),
            str(data["namespace"]),
            str(data["name"]),
            str(data["target_path"]),
            float(data["mounted_at"]),
            str(data.get("revision") or ""),
        )
    except (KeyError, TypeError, ValueError):
        return None


def records_in(directory: Path) -> list[Path]:
    """The finished records in one of the store's directories, sorted ([] while it does not exist)."""
    try:
        return sorted(p for p in directory.iterdir() if is_record_name(p.name))
    except (FileNotFoundError, NotADirectoryError):
        return []


def all_mounts(layout: StoreLayout) -> list[MountRecord]:
    records = (record_from(read_json(p)) for p in records_in(layout.mounts_dir))
    return [r for r in records if r is not None]


def mounts_for(layout: StoreLayout, namespace: str, name: str) -> list[MountRecord]:
    return [r for r in all_mounts(layout) if r.namespace == namespace and r.name == name]


def last_used(layout: StoreLayout, namespace: str, name: str) -> float | None:
    """Time of the last unmount, or None if the cache was never used on this node."""
    try:
        return layout.used_stamp(namespace, name).stat().st_mtime
    except FileNotFoundError:
        return None


# ---- hydration requests (CSI -> agent) and progress (agent -> CSI) --------


def pending_hydration_requests(layout: StoreLayout) -> list[tuple[str, str]]:
    found = (request_owner(p.name, read_json(p)) for p in records_in(layout.requests_dir))
    return [owner for owner in found if owner is not None]


def clear_hydration_request(layout: StoreLayout, namespace: str, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        layout.request_file(namespace, name).unlink()


@dataclass(frozen=True)
class Progress:
    phase: str
    bytes_done: int = 0
    bytes_total: int = 0
    message: str = ""
    updated_at: float = 0.0
    eta_seconds: int | None = None  # time left at the download's current rate, when known


def write_progress(layout: StoreLayout, namespace: str, name: str, progress: Progress) -> None:
    write_json_atomic(layout.progress_file(namespace, name), asdict(progress))


def read_progress(layout: StoreLayout, namespace: str, name: str) -> Progress | None:
    return progress_from(read_json(layout.progress_file(namespace, name)))


def progress_from(data: dict[str, Any] | None) -> Progress | None:
    """A progress record parsed from its JSON, None when malformed (shared with the CSI driver's reader)."""
    if not data:
        return None
    try:
        return Progress(
            str(data["phase"]),
            int(data.get("bytes_done", 0)),
            int(data.get("bytes_total", 0)),
            str(data.get("message", "")),
            float(data.get("updated_at", 0.0)),
            None if data.get("eta_seconds") is None else int(data["eta_seconds"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def clear_progress(layout: StoreLayout, namespace: str, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        layout.progress_file(namespace, name).unlink()
