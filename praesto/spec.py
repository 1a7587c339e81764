"""Parse and check a ModelCache spec into one typed value.

The sync hook, the validating webhook, `praesto render` and the node agent all
read specs through this module, so a rule is written once. Every problem is a
`SpecError` that names the field, the cause and the fix, in the words the
Kubernetes API uses for its own refusals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from praesto import names, ocireference
from praesto.privileges import privilege_errors
from praesto.quantity import QuantityError, parse_duration, parse_quantity
from praesto.refs import SECRET_KEY as _SECRET_KEY
from praesto.refs import SecretRef as SecretRef
from praesto.refs import SpecError as SpecError
from praesto.refs import check_secret_name as _check_secret_name
from praesto.updatestrategy import UpdateStrategy as UpdateStrategy
from praesto.updatestrategy import parse_update_strategy
from praesto.verification import Verification, parse_verification

HF_REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
_HF_REPO = re.compile(HF_REPO_PATTERN)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,253}[a-z0-9]$")
_LABEL_KEY_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
OBJECT_STORE_SCHEMES = ("s3", "gs", "az")
URI_SCHEMES = ("hf", *OBJECT_STORE_SCHEMES, ocireference.SCHEME)
# One example per scheme, as the parser accepts it: refusals and the commands' --help show these.
URI_EXAMPLES = {
    "hf": "hf://org/name[:revision]",
    "s3": "s3://bucket/prefix",
    "gs": "gs://bucket/prefix",
    "az": "az://container/prefix",
    ocireference.SCHEME: f"{ocireference.SCHEME}://host/repository[:tag|@sha256:digest]",
}
COMMIT_PATTERN = re.compile(r"^[0-9a-f]{40}$")
SOURCE_FORMS = ("huggingface", "oci", "uri")  # spec.source's one-of
# allowPatterns / ignorePatterns (the CRDs' maxItems and maxLength): every listed file is matched
# against every pattern, so a plan's file cap (agent/download/api.py MAX_FILES) times these bounds
# is the most matching a copy's plan does; a real list holds a few, each far shorter.
MAX_PATTERNS = 32
MAX_PATTERN_CHARS = 256


@dataclass(frozen=True)
class Source:
    scheme: str  # hf, s3, gs, az, oci
    location: str  # org/name for hf, bucket/prefix for object stores, host/repository for oci
    revision: str = ""
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()
    secret_ref: SecretRef | None = None

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self.location}"

    @property
    def pinned(self) -> bool:
        return self.is_pin(self.revision)

    def is_pin(self, revision: str) -> bool:
        """Whether `revision` names exact content for this kind of source: a 40-hex commit for the
        Hub, a manifest digest for OCI (tags and branches move; object stores have neither)."""
        if self.scheme == ocireference.SCHEME:
            return bool(ocireference.DIGEST.match(revision))
        return bool(COMMIT_PATTERN.match(revision))

    @property
    def resolves(self) -> bool:
        """Whether a moving name (branch, tag) is resolved once and pinned for every node."""
        return self.scheme in ("hf", ocireference.SCHEME)

    @property
    def object_store(self) -> bool:
        return self.scheme in OBJECT_STORE_SCHEMES

    @property
    def version(self) -> str:
        """What a rolling update changes: the revision of a Hub repo or OCI repository (branch,
        tag, commit or digest), the `bucket/prefix` of an object store (its objects have no
        revision a spec could name; a new model version is published under a new prefix)."""
        return self.location if self.object_store else self.revision

    def with_version(self, version: str) -> Source:
        if self.object_store:
            return Source(
                self.scheme, version, "", self.allow_patterns, self.ignore_patterns, self.secret_ref
            )
        return self.with_revision(version)

    @property
    def lineage(self) -> str:
        """What stays across a rolling update: the repository, or the object store's bucket."""
        if self.object_store:
            return f"{self.scheme}://{self.location.partition('/')[0]}"
        return self.uri

    def rolls_to(self, other: Source) -> bool:
        """Whether `other` is this source at another version (a rolling update may make that
        change): the same repository (Hub, OCI) or bucket (object stores), filters and secret."""
        return self.lineage == other.lineage and self.with_version(other.version) == other

    def with_revision(self, revision: str) -> Source:
        return Source(
            self.scheme, self.location, revision, self.allow_patterns, self.ignore_patterns, self.secret_ref
        )

    def to_dict(self) -> dict[str, Any]:
        """The resolved form carried by ModelCacheNode.spec.source."""
        out: dict[str, Any] = {"uri": self.uri}
        if self.revision:
            out["revision"] = self.revision
        if self.allow_patterns:
            out["allowPatterns"] = list(self.allow_patterns)
        if self.ignore_patterns:
            out["ignorePatterns"] = list(self.ignore_patterns)
        if self.secret_ref:
            ref: dict[str, str] = {"name": self.secret_ref.name}
            if self.secret_ref.key:
                ref["key"] = self.secret_ref.key
            out["secretRef"] = ref
        return out


@dataclass(frozen=True)
class ModelCacheSpec:
    source: Source
    size: str
    size_bytes: int
    storage_class_name: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    unused_ttl: str | None = None
    unused_ttl_seconds: float | None = None
    downloader: dict[str, Any] = field(default_factory=dict)
    prewarm: bool = False  # spec.prewarm: read the copy into the page cache when a Pod mounts it
    warm_new_nodes: bool = False  # spec.warmNewNodes: new nodes stay tainted until this copy is Ready
    verification: Verification | None = None  # spec.verification: the signature the model must carry
    update_strategy: UpdateStrategy = field(default_factory=UpdateStrategy)  # spec.updateStrategy

    @property
    def mode(self) -> str:
        return names.MODE_PVC if self.storage_class_name else names.MODE_NODE


class InvalidSpec(ValueError):
    def __init__(self, errors: list[SpecError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def parse_uri(uri: str, field_path: str = "spec.source.uri") -> tuple[Source | None, list[SpecError]]:
    """`hf://org/name[:revision]`, `s3://bucket/prefix`, `gs://…`, `az://…`, `oci://host/repo[:tag|@digest]`."""
    if not isinstance(uri, str) or "://" not in uri:
        return None, [
            SpecError(field_path, "must be a URI such as hf://org/name", "write scheme://location", uri)
        ]
    scheme, _, rest = uri.partition("://")
    if scheme not in URI_SCHEMES:
        return None, [
            SpecError(
                field_path,
                f"unsupported scheme {scheme!r}",
                f"use one of {', '.join(s + '://' for s in URI_SCHEMES)}",
                uri,
            )
        ]
    if scheme == "hf":
        repo, _, revision = rest.partition(":")
        if not _HF_REPO.match(repo):
            return None, [
                SpecError(field_path, "Hugging Face repo must be org/name", "e.g. hf://org/name", uri)
            ]
        errors = _check_revision(revision, field_path) if revision else []
        return Source("hf", repo, revision or names.DEFAULT_REVISION), errors
    if scheme == ocireference.SCHEME:
        return parse_oci_reference(rest, field_path)
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket):
        return None, [
            SpecError(
                field_path,
                f"{bucket!r} is not a valid bucket or container name",
                f"e.g. {URI_EXAMPLES[scheme]}",
                uri,
            )
        ]
    return Source(scheme, f"{bucket}/{prefix}".rstrip("/") if prefix else bucket), []


def parse_oci_reference(reference: Any, field_path: str) -> tuple[Source | None, list[SpecError]]:
    """An OCI artifact: `Source("oci", host/repository, tag or sha256 digest)`."""
    try:
        ref = ocireference.parse_reference(reference)
    except ocireference.ReferenceError as error:
        fix = "write registry-host/repository:tag or registry-host/repository@sha256:<digest>"
        return None, [SpecError(field_path, str(error), fix, reference)]
    return Source(ocireference.SCHEME, ref.location, ref.revision), []


def _parse_oci(oci: Any, errors: list[SpecError]) -> Source | None:
    base = "spec.source.oci"
    if not isinstance(oci, dict) or not oci.get("reference"):
        errors.append(
            SpecError(f"{base}.reference", "Required value", "set the artifact, e.g. ghcr.io/team/model:1.0")
        )
        return None
    parsed, problems = parse_oci_reference(oci["reference"], f"{base}.reference")
    errors.extend(problems)
    return parsed


def _check_revision(revision: Any, field_path: str) -> list[SpecError]:
    ok = (
        isinstance(revision, str)
        and 0 < len(revision) <= 255
        and not revision.startswith(("/", "-", "."))
        and not revision.endswith(("/", ".lock", "."))
        and ".." not in revision
        and "//" not in revision
        and "@{" not in revision
        and not re.search(r"[\x00-\x20~^:?*\[\\\x7f]", revision)
    )
    if ok:
        return []
    return [
        SpecError(
            field_path,
            "is not a valid git branch, tag or commit",
            "use a branch such as main, a tag, or a 40-hex commit",
            revision,
        )
    ]


def _check_patterns(value: Any, field_path: str) -> tuple[tuple[str, ...], list[SpecError]]:
    if value is None:
        return (), []
    if not isinstance(value, list) or not all(isinstance(p, str) and p and "\x00" not in p for p in value):
        return (), [
            SpecError(
                field_path, "must be a list of non-empty glob patterns", 'e.g. ["*.json", "*.safetensors"]'
            )
        ]
    if len(value) > MAX_PATTERNS or any(len(p) > MAX_PATTERN_CHARS for p in value):
        return (), [
            SpecError(
                field_path,
                f"holds at most {MAX_PATTERNS} patterns of at most {MAX_PATTERN_CHARS} characters each",
                "match several files with one pattern (e.g. *.safetensors, or a folder/)",
            )
        ]
    return tuple(value), []


def _parse_huggingface(hf: Any, errors: list[SpecError]) -> Source | None:
    base = "spec.source.huggingface"
    if not isinstance(hf, dict):
        errors.append(SpecError(base, "must be an object", "set source.huggingface.repo: org/name"))
        return None
    repo = hf.get("repo")
    if not repo:
        errors.append(SpecError(f"{base}.repo", "Required value", "set the Hugging Face repo as org/name"))
    elif not isinstance(repo, str) or not _HF_REPO.match(repo):
        errors.append(
            SpecError(f"{base}.repo", "must be org/name", "e.g. TinyLlama/TinyLlama-1.1B-Chat-v1.0", repo)
        )
    revision = hf.get("revision") or names.DEFAULT_REVISION
    errors.extend(_check_revision(revision, f"{base}.revision"))
    allow, e1 = _check_patterns(hf.get("allowPatterns"), f"{base}.allowPatterns")
    ignore, e2 = _check_patterns(hf.get("ignorePatterns"), f"{base}.ignorePatterns")
    errors.extend(e1 + e2)
    secret_ref = None
    token = hf.get("token")
    if token is not None:
        ref = token.get("secretRef") if isinstance(token, dict) else None
        if not isinstance(ref, dict):
            errors.append(
                SpecError(f"{base}.token.secretRef", "Required value", "set secretRef.name and secretRef.key")
            )
        else:
            name, key = ref.get("name"), ref.get("key")
            if not name or not key:
                missing = "name" if not name else "key"
                errors.append(
                    SpecError(
                        f"{base}.token.secretRef.{missing}",
                        "secretRef.name and secretRef.key must be configured together",
                        "set both the Secret's name and the key that holds the token",
                    )
                )
            else:
                errors.extend(_check_secret_name(name, f"{base}.token.secretRef.name"))
                if not isinstance(key, str) or not _SECRET_KEY.match(key):
                    errors.append(
                        SpecError(
                            f"{base}.token.secretRef.key", "is not a valid Secret key", "e.g. HF_TOKEN", key
                        )
                    )
                else:
                    secret_ref = SecretRef(name, key)
    if errors or not isinstance(repo, str):
        return None
    return Source("hf", repo, revision, allow, ignore, secret_ref)


def _parse_source(source: Any, errors: list[SpecError]) -> Source | None:
    if not isinstance(source, dict) or not source:
        errors.append(SpecError("spec.source", "Required value", "set source.huggingface.repo or source.uri"))
        return None
    forms = [k for k in SOURCE_FORMS if source.get(k)]
    if len(forms) != 1:
        cause = (
            "exactly one source form is required"
            if not forms
            else f"source.{forms[0]} and source.{forms[1]} are both set"
        )
        errors.append(
            SpecError("spec.source", cause, "set one of source.huggingface, source.oci or source.uri")
        )
        return None
    if forms[0] == "huggingface":
        parsed = _parse_huggingface(source["huggingface"], errors)
    elif forms[0] == "oci":
        parsed = _parse_oci(source["oci"], errors)
    else:
        parsed, uri_errors = parse_uri(source["uri"])
        errors.extend(uri_errors)
    secret = source.get("secretRef")
    if parsed is not None and secret is not None:
        if parsed.secret_ref is not None:
            errors.append(
                SpecError(
                    "spec.source.secretRef",
                    "source.huggingface.token and source.secretRef are both set",
                    "keep one: the token Secret or the credentials Secret",
                )
            )
        elif not isinstance(secret, dict):
            errors.append(SpecError("spec.source.secretRef", "must be an object", "set secretRef.name"))
        else:
            errors.extend(_check_secret_name(secret.get("name"), "spec.source.secretRef.name"))
            key = secret.get("key")
            if key is not None and (not isinstance(key, str) or not _SECRET_KEY.match(key)):
                errors.append(
                    SpecError("spec.source.secretRef.key", "is not a valid Secret key", "e.g. HF_TOKEN", key)
                )
            if not errors:
                parsed = Source(
                    parsed.scheme,
                    parsed.location,
                    parsed.revision,
                    parsed.allow_patterns,
                    parsed.ignore_patterns,
                    SecretRef(secret["name"], key),
                )
    return None if errors else parsed


def source_of(source: Any) -> Source | None:
    """`spec.source` parsed, None when it is not valid (parse_spec says why)."""
    return _parse_source(source, [])


def _parse_node_selector(value: Any, errors: list[SpecError]) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.append(
            SpecError(
                "spec.nodeSelector",
                "must be a map of label keys to values",
                'e.g. praesto.io/cache-node: "true"',
            )
        )
        return {}
    for key, val in value.items():
        prefix, _, name = str(key).rpartition("/")
        if not _LABEL_KEY_NAME.match(name) or len(name) > 63 or len(prefix) > 253:
            errors.append(
                SpecError(f"spec.nodeSelector[{key}]", "is not a valid label key", "use [prefix/]name", key)
            )
        if not isinstance(val, str) or not names.is_label_value(val):
            errors.append(
                SpecError(f"spec.nodeSelector[{key}]", "is not a valid label value", 'quote it: "true"', val)
            )
    return {str(k): str(v) for k, v in value.items()}


def parse_spec(spec: Any) -> ModelCacheSpec:
    """Typed spec, or `InvalidSpec` listing every problem at once."""
    errors: list[SpecError] = []
    if not isinstance(spec, dict):
        raise InvalidSpec([SpecError("spec", "Required value", "set spec.source and spec.storage.size")])
    source = _parse_source(spec.get("source"), errors)

    storage = spec.get("storage")
    size, size_bytes = "", 0
    storage_class = ""
    if not isinstance(storage, dict) or storage.get("size") in (None, ""):
        errors.append(
            SpecError("spec.storage.size", "Required value", "set the size the model needs, e.g. 5Gi")
        )
    else:
        size = str(storage["size"])
        try:
            size_bytes = parse_quantity(storage["size"])
            if size_bytes <= 0:
                errors.append(SpecError("spec.storage.size", "must be greater than zero", "e.g. 5Gi", size))
        except QuantityError:
            errors.append(SpecError("spec.storage.size", "is not a quantity", "e.g. 5Gi or 500Mi", size))
        sc = storage.get("storageClassName")
        if sc is not None and not isinstance(sc, str):
            errors.append(
                SpecError("spec.storage.storageClassName", "must be a string", "name a StorageClass", sc)
            )
        storage_class = sc if isinstance(sc, str) else ""

    node_selector = _parse_node_selector(spec.get("nodeSelector"), errors)
    warm = spec.get("warmNewNodes", False)
    if not isinstance(warm, bool):
        errors.append(SpecError("spec.warmNewNodes", "must be true or false", "set warmNewNodes: true", warm))

    prewarm = spec.get("prewarm", False)
    if not isinstance(prewarm, bool):
        errors.append(
            SpecError("spec.prewarm", "must be true or false", "set prewarm: true or remove it", prewarm)
        )

    ttl, ttl_seconds = None, None
    eviction = spec.get("eviction")
    if eviction is not None:
        raw = eviction.get("unusedTTL") if isinstance(eviction, dict) else eviction
        if raw is not None:
            try:
                ttl_seconds = parse_duration(str(raw))
                ttl = str(raw)
                if ttl_seconds <= 0:
                    errors.append(SpecError("spec.eviction.unusedTTL", "must be positive", "e.g. 24h", raw))
            except QuantityError:
                errors.append(
                    SpecError("spec.eviction.unusedTTL", "is not a duration", "e.g. 30m, 24h or 7d", raw)
                )

    downloader = spec.get("downloader") or {}
    if not isinstance(downloader, dict):
        errors.append(
            SpecError(
                "spec.downloader", "must be an object", "set image, resources or containerSecurityContext"
            )
        )
        downloader = {}
    for key in ("resources", "containerSecurityContext"):
        if key in downloader and not isinstance(downloader[key], dict):
            errors.append(
                SpecError(f"spec.downloader.{key}", "must be an object", "see the Kubernetes container spec")
            )
    context = downloader.get("containerSecurityContext")
    if isinstance(context, dict):
        errors.extend(SpecError(f, cause, fix) for f, cause, fix in privilege_errors(context))
    if "image" in downloader and (
        not isinstance(downloader["image"], str) or not downloader["image"].strip()
    ):
        errors.append(
            SpecError(
                "spec.downloader.image",
                "must be a non-empty image reference",
                "e.g. ghcr.io/org/praesto:0.7.0",
            )
        )

    verification = parse_verification(spec.get("verification"), errors)
    update_strategy = parse_update_strategy(spec.get("updateStrategy"), errors)

    if errors or source is None:
        raise InvalidSpec(
            errors or [SpecError("spec.source", "Required value", "set source.huggingface.repo")]
        )
    return ModelCacheSpec(
        source=source,
        size=size,
        size_bytes=size_bytes,
        storage_class_name=storage_class,
        node_selector=node_selector,
        unused_ttl=ttl,
        unused_ttl_seconds=ttl_seconds,
        downloader=dict(downloader),
        prewarm=prewarm is True,
        warm_new_nodes=warm is True,
        verification=verification,
        update_strategy=update_strategy,
    )


def source_from_node_spec(source: dict[str, Any]) -> Source:
    """Source carried by a ModelCacheNode (written by the sync hook from `Source.to_dict`)."""
    parsed, errors = parse_uri(source.get("uri", ""), "spec.source.uri")
    if parsed is None or errors:
        raise InvalidSpec(errors)
    ref = source.get("secretRef")
    return Source(
        parsed.scheme,
        parsed.location,
        source.get("revision") or parsed.revision,
        tuple(source.get("allowPatterns") or ()),
        tuple(source.get("ignorePatterns") or ()),
        SecretRef(ref["name"], ref.get("key")) if ref else None,
    )
