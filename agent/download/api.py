"""What the downloader promises its callers (the agent, the PVC-mode Job, users).

The agent plans capacity with `plan()` before it spends any bytes, then calls
`download()`; both raise `DownloadError` whose `reason` is one of `REASONS`
and becomes a condition reason on the ModelCacheNode as it is.

A download's inputs are fixed before it starts: `EngineSettings` (a process's section, built once
at its edge), `Options` (that section plus one download's request) and `PartSources` (peers,
arrivals, the origin budget). Past ~400 lines on purpose: this is the downloader's whole contract,
read in one place by its callers and by every origin.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol

from praesto.agent.download.arrivals import Arrivals
from praesto.agent.download.digests import ALGORITHMS, RunningDigest, StoreDigest
from praesto.agent.download.egress import REASON_EGRESS_REFUSED, EgressPolicy
from praesto.agent.download.proxies import proxies_from_env

from praesto import credscope, names
from praesto.quantity import format_bytes
from praesto.spec import Source
from praesto.store import RequiredSignature

REASONS = (
    "RepoNotFound",
    "Unauthorized",
    "GatedRepo",
    "RevisionNotFound",
    "ChecksumMismatch",
    "InsufficientDiskSpace",
    "SourceUnavailable",
    "InvalidRepoFile",
    "WaitingForCredentials",  # the source refused anonymous access and no credential is configured
    "SizeExceedsRequest",  # --max-bytes: the source is larger than the volume it must fit (PVC mode)
    names.REASON_SIGNATURE_INVALID,  # a required model signature is missing, invalid or does not match
    REASON_EGRESS_REFUSED,  # the origin, a redirect or a token realm is an address the egress rule refuses
)
# `extra` of the log records that sum up a plan or a publication: `praesto-agent download` says
# these itself, in its own words, and drops the records (else each line is printed twice).
SUMMARY_RECORD = "praesto_summary"
SUMMARY = {SUMMARY_RECORD: True}


class DownloadCancelled(Exception):
    """`Options.cancel` was set: the download stopped and left resumable staging behind.

    Not a `DownloadError`: a cancel is the caller's decision, not a failure to report.
    """


class DownloadError(Exception):
    """A download that cannot finish; `reason` is machine-readable, `message` human.

    Raise one of its two kinds: the kind is the retry policy (kopf's `TemporaryError` /
    `PermanentError`), read by the agent's reconciler (how soon to try again) and the CLI (its
    exit code). Callers catch `DownloadError`.
    """

    # The agent's next attempt comes after its backoff times this (agent/reconcile.py).
    backoff_factor: ClassVar[float] = 4.0

    def __init__(self, reason: str, message: str) -> None:
        if type(self) is DownloadError:
            raise TypeError(
                "raise TemporaryDownloadError or LastingDownloadError: the kind is the retry policy"
            )
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason = reason
        self.message = message


class TemporaryDownloadError(DownloadError):
    """Likely to pass by itself (a dropped connection, a 5xx, a throttle outlasting the engine's own
    retries): the agent tries again on its short backoff; the CLI exits EX_TEMPFAIL (75)."""

    backoff_factor: ClassVar[float] = 1.0


class LastingDownloadError(DownloadError):
    """Lasts until something outside the download changes (the source's contents or access, a
    Secret, room on disk, the spec): the agent tries again only on its long backoff (4x), since such
    a change need not touch the spec (a repository made public, a Secret fixed); the CLI exits 1."""


ARCHIVE_KINDS = ("tar", "tar+gzip", "tar+zstd")  # OCI layers unpacked into the tree (unpack.py)
# Files one copy may hold: each takes an inode, a manifest entry and the agent's memory from the plan
# on. A plan of more is refused before anything is fetched (check_file_count, from the Hub and
# object-store planners), an archive's files and folders past it as they unpack (unpack.py); the
# scale bench.agent_scale_bench measures.
MAX_FILES = 100_000


def hub_refused_token(uri: str, had_token: bool) -> LastingDownloadError:
    """A model hub's 401, in the same words for every hub origin: the token refused, or none given
    for a repo that may be private."""
    hint = (
        "the token was refused; check that it is valid"
        if had_token
        else "the repo does not exist, or it is private and needs a token (token.secretRef)"
    )
    return LastingDownloadError("Unauthorized", f"{uri}: {hint}")


def check_file_count(uri: str, count: int, limit: int, fix: str) -> None:
    """Refuse a selection of more than `limit` files, naming both numbers and how to narrow it."""
    if count > limit:
        raise LastingDownloadError(
            "InvalidRepoFile",
            f"{uri}: {count} files to fetch, more than the {limit} one copy may hold; {fix}",
        )


@dataclass(frozen=True)
class Archive:
    """An OCI layer that is a tar of model files, not a model file: it is fetched and verified as a
    whole (by its digest), then unpacked into the tree and removed (agent/download/unpack.py)."""

    kind: str  # one of ARCHIVE_KINDS
    layer_path: str  # the file or folder it holds, as the manifest names it (for messages)
    # The most bytes its files may hold, as the artifact says: the ModelPack file metadata's size
    # (no more than the layer's own size for an uncompressed tar, which holds no more than itself);
    # None for a compressed layer without metadata: unknown until unpacked, so every size check
    # counts the copy's bound (storage.size) for it (Plan.disk_bytes) and unpack.py stops there.
    unpacked_limit: int | None = None


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative, POSIX, already checked not to escape the destination
    size: int
    sha256: str | None = None  # LFS files
    git_sha1: str | None = None  # small files: git blob id
    digest: StoreDigest | None = None  # object stores: the store's own checksum of the whole object
    etag: str | None = None  # object stores: fetched with If-Match, so a changed object is noticed
    version: str | None = None  # object stores: the object version planned (versioned buckets)
    key: str | None = None  # object stores: the object's key in its bucket; OCI: the blob's URL
    archive: Archive | None = None  # OCI: a layer to unpack, not a file of the model
    layer: str | None = None  # OCI: the archive layer (sha256:...) this file was unpacked from
    # Hugging Face: the file's Xet hash (tree `xetHash`), for LFS files only (their sha256 still
    # verifies them); None: not stored in Xet, or Xet is off (origins/huggingface/xetpath.py)
    xet_hash: str | None = None

    @property
    def verified_by(self) -> str | None:
        """The digest the origin published for this file before any byte was fetched, if any."""
        if self.layer:
            return "oci-layer-sha256"  # the whole layer it came from was verified, then unpacked
        if self.sha256:
            return "sha256"
        if self.git_sha1:
            return "git-blob-sha1"
        return self.digest.algorithm if self.digest else None

    @property
    def peers_may_supply(self) -> bool:
        """Only a file the origin vouches for by sha256 may come from peers: what verifies it is
        the origin's word, and no one can make other bytes match it. Git's SHA-1 and MD5 can be
        collided on purpose (whoever publishes one of a crafted pair could pass the other off
        from a peer), and a CRC is no digest at all: such files come from the origin only."""
        return bool(self.sha256 or (self.digest and self.digest.algorithm == "sha256"))

    @property
    def cryptographically_verified(self) -> bool:
        """A digest no accident can match (sha256, SHA-1, MD5): no store checksum is looked for."""
        return bool(self.sha256 or self.git_sha1 or (self.digest and self.digest.cryptographic))

    def second_digest(self) -> RunningDigest | None:
        """What to compute besides sha256 to check the origin's digest (None: sha256 suffices)."""
        if self.sha256:
            return None
        if self.git_sha1:
            return hashlib.sha1(b"blob %d\0" % self.size, usedforsecurity=False)  # git's object id
        if self.digest and self.digest.algorithm != "sha256":
            return ALGORITHMS[self.digest.algorithm].new()
        return None

    def mismatch(self, sha256: str, second: str | None) -> tuple[str, str] | None:
        """(expected, got) when computed digests contradict the listing; None when they agree.

        `second` is what `second_digest()` computed besides sha256.
        """
        if self.sha256:
            return None if sha256 == self.sha256 else (f"sha256 {self.sha256}", sha256)
        if self.git_sha1:
            return None if second == self.git_sha1 else (f"git blob {self.git_sha1}", str(second))
        if self.digest:
            got = sha256 if self.digest.algorithm == "sha256" else str(second)
            return None if got == self.digest.value else (self.digest.describe(), got)
        return None


@dataclass(frozen=True)
class Plan:
    """What a source resolves to: an exact revision and every file to fetch."""

    source: Source
    revision: str  # commit for Hugging Face; a digest of object versions for stores; OCI: manifest digest
    files: tuple[RemoteFile, ...]
    # OCI: the archive layers `files` were unpacked from (unpack.py), recorded in the manifest so a
    # later run with the same layer-level plan knows the copy is complete (publish.is_published).
    layers: tuple[RemoteFile, ...] = ()

    @property
    def total_bytes(self) -> int:
        """The bytes fetched: every file and archive layer as the origin serves it (progress)."""
        return sum(f.size for f in self.files)

    @property
    def unpacked_unknown(self) -> bool:
        """An archive layer says nothing of what it unpacks to (a compressed layer without metadata)."""
        return any(f.archive is not None and f.archive.unpacked_limit is None for f in self.files)

    def disk_bytes(self, bound: int | None) -> int:
        """The most bytes the download puts on disk at once, the one number every size check counts
        (storage.size, --max-bytes, the node's room; the namespace quota counts storage.size): every
        file and archive layer as fetched, plus what each archive unpacks to (unpack.py keeps the
        layers until they are unpacked). An archive that does not say counts the whole `bound`, the
        most the copy may take (unpack.py stops it there); with no bound, only what is known."""
        known = self.total_bytes + sum(
            f.archive.unpacked_limit or 0 for f in self.files if f.archive is not None
        )
        return max(known, bound) if bound is not None and self.unpacked_unknown else known

    def describe_size(self) -> str:
        """What is known of `disk_bytes`, for messages: '1.2 GiB (1288490188 bytes)', or 'at least ...'."""
        need = self.disk_bytes(None)
        said = f"{format_bytes(need)} ({need} bytes)"
        if self.unpacked_unknown:
            return f"at least {said} (an archive layer's unpacked size is known only once unpacked)"
        return said


@dataclass
class Result:
    plan: Plan
    bytes_from_origin: int = 0
    bytes_from_peers: int = 0  # fetched from other nodes' copies (praesto.agent.peers), verified the same way
    bytes_deduplicated: int = 0
    bytes_resumed: int = 0
    # of those fetched, the bytes written with O_DIRECT, past the page cache (writes.py)
    bytes_written_direct: int = 0
    # Hugging Face files fetched through Xet (origins/huggingface/xetpath.py): xorb-range bytes from the
    # origin (also in bytes_from_origin), files verified that way, and files that fell back to resolve/,
    # by cause
    bytes_from_xet: int = 0
    xet_files: int = 0
    xet_fallbacks: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total)
Sink = Callable[[int, memoryview], None]  # (file offset, bytes) as they arrive


class PartSource(Protocol):
    """Somewhere other than the origin that may hold a file's bytes (peer nodes).

    The engine asks it first for every byte range and fetches whatever it did not
    deliver from the origin. Hashes still come from the plan (the origin), so a
    source can cost time, never correctness: `blame` is told about a file that
    failed verification and answers whether it contributed (the engine then
    re-fetches that file from the origin only, without counting it as an origin
    failure).
    """

    def fetch(self, file: RemoteFile, start: int, end: int, sink: Sink, cancel: threading.Event) -> int:
        """Deliver bytes from `start` on, in order, into `sink`; return how many (0..end-start)."""
        ...

    def blame(self, file: RemoteFile) -> bool: ...


@dataclass(frozen=True)
class Target:
    """Where a file's bytes come from after redirects, and whether auth may be sent there."""

    url: str
    authorized: bool


class ByteSource(Protocol):
    """Where parts come from: the Hub over HTTP (http.Transport) or an object store (origins/objstore/fetch.py)."""

    def resolve(self, url: str) -> Target: ...

    def fetch(
        self,
        target: Target,
        start: int,
        end: int,
        sink: Callable[[int, memoryview], None],
        cancel: threading.Event,
    ) -> int: ...

    def close(self) -> None: ...


class OriginThrottle(Protocol):
    """What stands between a download and its origin (the cluster-wide budget, agent/budget).

    `wrap` gets the origin's byte source (`ByteSource`) and returns one that
    waits for the budget before each request; peers are never behind it.
    """

    def wrap(self, source: ByteSource) -> ByteSource: ...


SIGNATURE_METHODS = ("publicKey", "certificate", "sigstore")  # spec.verification.signature's one-of


@dataclass(frozen=True)
class SignaturePolicy:
    """Which signature a model must carry to be published (agent/download/signature.py checks it).

    Trust material is public (a public key, CA certificates) but is still never logged whole:
    messages name `origin`, where it came from, and its fingerprint.
    """

    method: str  # one of SIGNATURE_METHODS
    path: str  # the bundle, relative to the model's root (names.DEFAULT_SIGNATURE_FILE)
    origin: str  # where the trust material came from, for messages ("--signature-public-key key.pub")
    public_key: bytes = b""  # publicKey: PEM
    # certificate: PEM certificates the signing certificate must chain to (a root, then intermediates)
    certificates: tuple[bytes, ...] = ()
    identity: str = ""  # sigstore (keyless): the signer's identity, e.g. an e-mail
    oidc_issuer: str = ""  # sigstore: the OIDC issuer that vouched for it

    @property
    def trust(self) -> str:
        """A fingerprint of the trust material: a copy verified under other trust is not this one."""
        material = b"".join((self.public_key, *self.certificates, self.identity.encode(), b"\0"))
        return "sha256:" + hashlib.sha256(material + self.oidc_issuer.encode()).hexdigest()

    @property
    def required(self) -> RequiredSignature:
        """What a copy's manifest must record to stand for this policy (store.signature_mismatch)."""
        return RequiredSignature(self.method, self.path, self.trust, self.origin)


# How a download's large files reach the disk (writes.py): one name from `praesto-agent run --write-mode`
# (PRAESTO_WRITE_MODE, chart nodeAgent.writeMode) and `download --buffered-writes` to the engine.
WRITE_DIRECT, WRITE_BUFFERED = "direct", "buffered"
WRITE_MODES = (WRITE_DIRECT, WRITE_BUFFERED)


@dataclass(frozen=True)
class StoreEnvironment:
    """The object-store clients' variables (credscope.STORE_ENV) as the process started, kept by its
    edge (`of`) so that nothing below it holds the whole environment. Values may be secrets: never
    repr()ed."""

    pairs: frozenset[tuple[str, str]] = field(default=frozenset(), repr=False)

    @classmethod
    def of(cls, env: Mapping[str, str]) -> StoreEnvironment:
        """Only the names store_config reads, as set in `env` (set but empty counts as set)."""
        return cls(frozenset((name, value) for name, value in env.items() if name in credscope.STORE_ENV))

    def as_dict(self) -> dict[str, str]:
        return dict(self.pairs)


@dataclass(frozen=True)
class EngineSettings:
    """A process's download settings: built once at its edge (`AgentSettings.downloads`, the download
    CLI) and passed whole, never copied field by field nor changed after (kopf's `OperatorSettings`
    tree of frozen sections, kopf/_cogs/configs/configuration.py, is the model).

    `Options` is this section plus one download's request (`Options.of`).
    """

    endpoint: str | None = None  # HF_ENDPOINT / mirror; None: https://huggingface.co
    # MODELSCOPE_ENDPOINT / --modelscope-endpoint: the ModelScope hub or mirror; None: https://modelscope.cn
    modelscope_endpoint: str | None = None
    ca_bundle: str | None = None  # PRAESTO_CA_BUNDLE: extra PEM CA file byte fetches trust
    # What downloads take from the environment the process started with, read once at its edge
    # (`from_environment`): HTTP(S)_PROXY / NO_PROXY for byte fetches (proxies.py) ...
    proxies: Mapping[str, str] = field(default_factory=dict)
    # ... PRAESTO_OCI_MIRRORS (chart downloads.oci.mirrors) as set; origins/oci/registry.py reads it ...
    oci_mirrors: str = ""
    # ... and the object-store clients' own variables (workload identity, region, CA, proxies: only
    # the names origins/objstore/creds.py store_config reads); empty: none of them.
    store_environment: StoreEnvironment = field(default_factory=lambda: StoreEnvironment(), repr=False)
    max_files: int = MAX_FILES  # refuse a plan of more files (check_file_count); lowered only by tests
    concurrency: int = 32  # parallel connections: CDNs cap each one (see bench/download_bench.py)
    # Tuning (defaults measured by bench/download_bench.py); rarely worth changing.
    part_size: int = 16 << 20  # byte-range size for large files; also the resume granularity
    memory_budget: int = 32 << 20  # out-of-order bytes held for in-order hashing before re-reading
    checkpoint_seconds: float = 1.0  # how often completed parts are fsync'd and journaled
    # WRITE_DIRECT: O_DIRECT for large files' aligned chunks when staging is on a local disk
    # (writes.py); WRITE_BUFFERED: always through the page cache.
    write_mode: str = WRITE_DIRECT
    # OCI: speak plain HTTP to a registry on this machine (--plain-http; refused for any other host).
    plain_http: bool = False
    # Where a tenant's input may send this process (egress.py): the platform's allowed networks
    # (downloads.egress.allowedCIDRs); the default refuses every internal address.
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    # Hugging Face files stored in Xet come through the Xet CAS (origins/huggingface/xetpath.py;
    # --xet, chart downloads.xet.enabled); False: every file whole through resolve/, as before.
    xet: bool = False
    # No byte for this long from the Xet token service or CAS: that file falls back to resolve/.
    xet_stall_seconds: float = 30.0

    def __post_init__(self) -> None:
        assert self.write_mode in WRITE_MODES, self.write_mode

    @classmethod
    def from_environment(cls, env: Mapping[str, str], **settings: Any) -> EngineSettings:
        """The section with what downloads take from `env`, the environment the process started
        with (its edge's copy): the proxies, the OCI mirrors and the object-store clients' variables."""
        env = dict(env)  # one copy, as the process started (the chart's inventory counts named reads of it)
        mirrors = env.get(names.ENV_OCI_MIRRORS, "")
        store = StoreEnvironment.of(env)
        return cls(proxies=proxies_from_env(env), oci_mirrors=mirrors, store_environment=store, **settings)


@dataclass(frozen=True)
class Options(EngineSettings):
    """One download's inputs, fixed before it starts: the process's settings section (the fields
    of `EngineSettings`) and this download's request (below). What else serves its bytes (peers,
    arrivals, the origin budget) is not here: `PartSources`, handed to `download` beside it."""

    token: str | None = field(default=None, repr=False)  # held in memory only; never logged or repr()ed
    # Object stores: settings from a credentials Secret (origins/objstore/creds.py keys); memory only, never logged.
    credentials: dict[str, str] | None = field(default=None, repr=False)
    credentials_from: str = "the environment"  # where they came from, for messages
    # False when the credentials are the cache's own Secret: then only that Secret is used,
    # never the cluster's workload identity (origins/objstore/creds.py store_config).
    identity_allowed: bool = True
    max_bytes: int | None = None  # refuse before writing when the source is larger (PVC: storage.size)
    blobs_dir: Path | None = None  # content-addressed area for dedup (hard links)
    # Who may reuse small files recorded by origin key (publish.origin_key): the namespace. Their
    # bytes are verified only by git SHA-1, so they are never linked into another namespace.
    dedup_scope: str = ""
    staging_dir: Path | None = None  # default: a sibling of dest on the same filesystem
    progress: ProgressCallback | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    # The owning ModelCache's UID, recorded in the manifest: the agent trusts a complete copy only
    # for that cache (praesto.store.copy_mismatch). Empty for `praesto-agent download` (pre-baking).
    cache_uid: str = ""
    # A signature the model must carry (spec.verification, --signature-*); None: none required.
    signature: SignaturePolicy | None = None
    # False: this download keeps no Xet chunks beside blobs_dir (the node has no room for them
    # above its reserve: agent/room.py); its files still come through Xet when they may.
    xet_chunks: bool = True

    @classmethod
    def of(cls, settings: EngineSettings, **request: Any) -> Options:
        """`settings` whole, with one download's `request` fields (token, staging, cancel, ...)."""
        whole = {f.name: getattr(settings, f.name) for f in fields(EngineSettings)}
        return cls(**whole, **request)


@dataclass(frozen=True)
class PartSources:
    """Where a download's bytes come from besides its origin, and what stands before the origin:
    handed to `download` with the `Options`, never patched into them (agent/jobs.py gathers them
    from the peering and the origin budget before the bytes)."""

    peers: PartSource | None = None  # other nodes' copies, tried before the origin per range
    # Where each part in flight has been written to, for peers copying it as it arrives (arrivals.py);
    # the agent's peering gives it for downloads other nodes may copy, None otherwise.
    arrivals: Arrivals | None = None
    throttle: OriginThrottle | None = (
        None  # the cluster's origin budget (praesto.agent.budget); None: ungated
    )


NO_SOURCES = PartSources()  # the origin only, ungated


Planner = Callable[[Source, Options], Plan]  # `plan()`, or a test's stand-in
# `download()`, or one wrapped (the origin budget)
Downloader = Callable[[Plan, Path, Options, PartSources], Result]
