"""The source kinds: one row per kind of origin, every rule the control plane needs of it.

A row says a kind's URI scheme and example, its `spec.source` form key, what names exact content
(its pin), whether a moving name is resolved once for every node, what a rolling update may change,
the shape of its credentials Secret, and its parsers. `Source`, the spec parser, the hooks, the
webhook and the agent's rolling rules ask this table; none of them names a kind. A new kind is one
row here, its CRD field, and its origin under agent/download/origins/ (tests/test_kind_rooms.py
keeps it so).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from praesto import names, ocireference
from praesto.refs import SecretRef, SpecError
from praesto.sourcefields import MAX_PATTERN_CHARS as MAX_PATTERN_CHARS
from praesto.sourcefields import MAX_PATTERNS as MAX_PATTERNS
from praesto.sourcefields import check_patterns, check_revision, token_ref

HF_REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
# ModelScope's client asks only for owner/name, both non-empty (modelscope_hub 0.5.1, which
# modelscope 1.40.2's hub/api.py delegates to: api.py `_parse_repo_id`); the id is a path segment of
# every hub URL (`/api/v1/models/{owner}/{name}/repo/files`, _legacy_api.py), so it is held to the
# same URL-safe set as the Hub's.
MS_REPO_PATTERN = HF_REPO_PATTERN
COMMIT_PATTERN = re.compile(r"^[0-9a-f]{40}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,253}[a-z0-9]$")

# What a rolling update changes (Kind.rolls).
ROLLS_REVISION = "revision"  # the revision (branch, tag, commit, digest) of the same repository
ROLLS_PREFIX = "prefix"  # the bucket/prefix within the same bucket (objects have no revision)

# How a kind's Secret reaches a download (Credential.shape).
TOKEN = "token"  # noqa: S105 - a name: one key, a bearer token, given as the environment variable `env`
FILE = "file"  # one key mounted as the file `file` (a registry login)
KEYS = "keys"  # the whole Secret, its standard key names (object-store keys and endpoint)


@dataclass(frozen=True)
class Credential:
    """The shape of a kind's credentials Secret (secretRef) and how a download receives it."""

    shape: str
    default_key: str = ""  # the key read when secretRef.key is not set ("" for KEYS: all of them)
    env: str = ""  # TOKEN: the variable the PVC-mode Job sets from the key
    file: str = ""  # FILE: the name the key is mounted as


@dataclass(frozen=True)
class Source:
    """A parsed source; what its kind rules (pins, resolves, rolls) it asks its row, `kind`."""

    scheme: str  # a Kind's scheme
    location: str  # org/name for hubs, bucket/prefix for object stores, host/repository for oci
    revision: str = ""
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()
    secret_ref: SecretRef | None = None

    @property
    def kind(self) -> Kind:
        return kind_of(self.scheme)

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self.location}"

    @property
    def pinned(self) -> bool:
        return self.is_pin(self.revision)

    def is_pin(self, revision: str) -> bool:
        """Whether `revision` names exact content for this kind (Kind.pin; object stores: never)."""
        pin = self.kind.pin
        return pin is not None and bool(pin.match(revision))

    @property
    def resolves(self) -> bool:
        """Whether a moving name (branch, tag) is resolved once and pinned for every node."""
        return self.kind.resolves

    @property
    def version(self) -> str:
        """What a rolling update changes (Kind.rolls): the revision, or an object store's
        `bucket/prefix` (its objects have no revision; a new version is a new prefix)."""
        return self.location if self.kind.rolls == ROLLS_PREFIX else self.revision

    def with_version(self, version: str) -> Source:
        if self.kind.rolls == ROLLS_PREFIX:
            return Source(
                self.scheme, version, "", self.allow_patterns, self.ignore_patterns, self.secret_ref
            )
        return self.with_revision(version)

    @property
    def lineage(self) -> str:
        """What stays across a rolling update: the repository, or the object store's bucket."""
        if self.kind.rolls == ROLLS_PREFIX:
            return f"{self.scheme}://{self.location.partition('/')[0]}"
        return self.uri

    def rolls_to(self, other: Source) -> bool:
        """Whether `other` is this source at another version (a rolling update may make that
        change): the same repository or bucket, filters and secret."""
        return self.lineage == other.lineage and self.with_version(other.version) == other

    def with_revision(self, revision: str) -> Source:
        return Source(
            self.scheme, self.location, revision, self.allow_patterns, self.ignore_patterns, self.secret_ref
        )

    def with_secret(self, secret_ref: SecretRef) -> Source:
        return Source(
            self.scheme, self.location, self.revision, self.allow_patterns, self.ignore_patterns, secret_ref
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


Parsed = tuple[Source | None, list[SpecError]]
UriParser = Callable[[str, str, str], Parsed]  # (text after scheme://, the whole uri, field path)
FormParser = Callable[[Any, list[SpecError]], Source | None]  # spec.source.<form> -> Source


@dataclass(frozen=True)
class Kind:
    """One row of the table."""

    scheme: str  # the URI scheme and Source.scheme
    example: str  # the URI form, as refusals and the commands' --help show it
    form: str  # its own spec.source.<form> key; "" when it is written only as spec.source.uri
    pin: re.Pattern[str] | None  # what names exact content; None: nothing (the prefix names itself)
    resolves: bool  # a moving name is resolved once (by the first node) and pinned for every node
    rolls: str  # ROLLS_REVISION or ROLLS_PREFIX
    credential: Credential
    parse_uri: UriParser
    parse_form: FormParser | None = None
    unpinned_advice: str = ""  # the webhook's warning for a moving {revision!r}
    form_revision: str = ""  # the form's key holding the revision alone: it may change (a rolling update)
    form_reference: str = ""  # the form's key naming repository and revision: may change if only that moves


def _hub(
    scheme: str, form: str, hub: str, pattern: str, branch: str, example_repo: str, key: str, patterns: bool
) -> tuple[UriParser, FormParser]:
    """(uri parser, form parser) of a git-backed model hub: org/name[:revision], a token Secret."""
    repo_re = re.compile(pattern)
    base = f"spec.source.{form}"

    def parse_uri(rest: str, uri: str, field_path: str) -> Parsed:
        repo, _, revision = rest.partition(":")
        if not repo_re.match(repo):
            return None, [
                SpecError(field_path, f"{hub} repo must be org/name", f"e.g. {scheme}://org/name", uri)
            ]
        errors = check_revision(revision, field_path, branch) if revision else []
        return Source(scheme, repo, revision or branch), errors

    def parse_form(spec: Any, errors: list[SpecError]) -> Source | None:
        if not isinstance(spec, dict):
            errors.append(SpecError(base, "must be an object", f"set source.{form}.repo: org/name"))
            return None
        repo = spec.get("repo")
        if not repo:
            errors.append(SpecError(f"{base}.repo", "Required value", f"set the {hub} repo as org/name"))
        elif not isinstance(repo, str) or not repo_re.match(repo):
            errors.append(SpecError(f"{base}.repo", "must be org/name", f"e.g. {example_repo}", repo))
        revision = spec.get("revision") or branch
        errors.extend(check_revision(revision, f"{base}.revision", branch))
        allow: tuple[str, ...] = ()
        ignore: tuple[str, ...] = ()
        if patterns:
            allow, e1 = check_patterns(spec.get("allowPatterns"), f"{base}.allowPatterns")
            ignore, e2 = check_patterns(spec.get("ignorePatterns"), f"{base}.ignorePatterns")
            errors.extend(e1 + e2)
        token = spec.get("token")
        secret_ref = token_ref(token, base, key, errors) if token is not None else None
        if errors or not isinstance(repo, str):
            return None
        return Source(scheme, repo, revision, allow, ignore, secret_ref)

    return parse_uri, parse_form


def parse_oci_reference(reference: Any, field_path: str) -> Parsed:
    """An OCI artifact: `Source("oci", host/repository, tag or sha256 digest)`."""
    try:
        ref = ocireference.parse_reference(reference)
    except ocireference.ReferenceError as error:
        fix = "write registry-host/repository:tag or registry-host/repository@sha256:<digest>"
        return None, [SpecError(field_path, str(error), fix, reference)]
    return Source(ocireference.SCHEME, ref.location, ref.revision), []


def _oci_uri(rest: str, uri: str, field_path: str) -> Parsed:
    return parse_oci_reference(rest, field_path)


def _oci_form(oci: Any, errors: list[SpecError]) -> Source | None:
    base = "spec.source.oci"
    if not isinstance(oci, dict) or not oci.get("reference"):
        errors.append(
            SpecError(f"{base}.reference", "Required value", "set the artifact, e.g. ghcr.io/team/model:1.0")
        )
        return None
    parsed, problems = parse_oci_reference(oci["reference"], f"{base}.reference")
    errors.extend(problems)
    return parsed


def _object_store(scheme: str, example: str) -> UriParser:
    def parse_uri(rest: str, uri: str, field_path: str) -> Parsed:
        bucket, _, prefix = rest.partition("/")
        if not _BUCKET.match(bucket):
            cause = f"{bucket!r} is not a valid bucket or container name"
            return None, [SpecError(field_path, cause, f"e.g. {example}", uri)]
        return Source(scheme, f"{bucket}/{prefix}".rstrip("/") if prefix else bucket), []

    return parse_uri


def _object_store_kind(scheme: str, example: str) -> Kind:
    return Kind(
        scheme=scheme,
        example=example,
        form="",  # spec.source.uri only
        pin=None,  # a prefix names itself: nothing to resolve, nothing to pin
        resolves=False,
        rolls=ROLLS_PREFIX,  # the prefix, within the same bucket
        credential=Credential(KEYS),
        parse_uri=_object_store(scheme, example),
    )


_HF_URI, _HF_FORM = _hub(
    "hf", "huggingface", "Hugging Face", HF_REPO_PATTERN, names.DEFAULT_REVISION,
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0", names.ENV_HF_TOKEN, patterns=True,
)  # fmt: skip
# ModelScope (modelscope 1.40.2): a repo's default revision is `master` (utils/constant.py
# DEFAULT_MODEL_REVISION); revisions are git branches and tags (GET /api/v1/models/{id}/revisions,
# RevisionMap.Branches/Tags, modelscope_hub 0.5.1 _legacy_api.py), and what pins is the git commit
# id each file of the list carries as `Revision` (hub/utils/caching.py: "'Revision': ... # commit id").
_MS_URI, _MS_FORM = _hub(
    "ms", "modelscope", "ModelScope", MS_REPO_PATTERN, "master",
    "Qwen/Qwen2.5-0.5B-Instruct", names.ENV_MODELSCOPE_TOKEN, patterns=False,
)  # fmt: skip
_BRANCH_ADVICE = (
    "spec.source: revision {revision!r} is a branch or tag, not a pinned commit; it is resolved once and "
    "recorded in status.resolvedRevision, pin a 40-hex commit to get the same files in every cluster"
)

# The table. Its order is the order refusals, --help and the CRD list schemes and forms in.
KINDS: tuple[Kind, ...] = (
    Kind(
        scheme="hf",
        example="hf://org/name[:revision]",
        form="huggingface",
        pin=COMMIT_PATTERN,
        resolves=True,
        rolls=ROLLS_REVISION,
        credential=Credential(TOKEN, default_key=names.ENV_HF_TOKEN, env=names.ENV_HF_TOKEN),
        parse_uri=_HF_URI,
        parse_form=_HF_FORM,
        unpinned_advice=_BRANCH_ADVICE,
        form_revision="revision",
    ),
    _object_store_kind("s3", "s3://bucket/prefix"),
    _object_store_kind("gs", "gs://bucket/prefix"),
    _object_store_kind("az", "az://container/prefix"),
    Kind(
        scheme=ocireference.SCHEME,
        example=f"{ocireference.SCHEME}://host/repository[:tag|@sha256:digest]",
        form="oci",
        pin=ocireference.DIGEST,  # a manifest digest
        resolves=True,
        rolls=ROLLS_REVISION,  # the tag or digest, within the same repository
        credential=Credential(FILE, default_key=names.DOCKER_CONFIG_KEY, file=names.DOCKER_CONFIG_KEY),
        parse_uri=_oci_uri,
        parse_form=_oci_form,
        unpinned_advice=(
            "spec.source: tag {revision!r} can be moved; it is resolved once to a manifest digest and "
            "recorded in status.resolvedRevision, reference @sha256:<digest> to get the same artifact "
            "in every cluster"
        ),
        form_reference="reference",
    ),
    Kind(
        scheme="ms",
        example="ms://org/name[:revision]",
        form="modelscope",
        pin=COMMIT_PATTERN,  # a git commit id
        resolves=True,
        rolls=ROLLS_REVISION,
        credential=Credential(TOKEN, default_key=names.ENV_MODELSCOPE_TOKEN, env=names.ENV_MODELSCOPE_TOKEN),
        parse_uri=_MS_URI,
        parse_form=_MS_FORM,
        unpinned_advice=_BRANCH_ADVICE,
        form_revision="revision",
    ),
)
_BY_SCHEME = {kind.scheme: kind for kind in KINDS}
URI_SCHEMES = tuple(_BY_SCHEME)
# One example per scheme, as the parser accepts it: refusals and the commands' --help show these.
URI_EXAMPLES = {kind.scheme: kind.example for kind in KINDS}
FORMS = {kind.form: kind for kind in KINDS if kind.form}  # spec.source.<form> -> its kind
SOURCE_FORMS = (*FORMS, "uri")  # spec.source's one-of


def kind_of(scheme: str) -> Kind:
    """The row of `scheme` (a parsed Source's scheme is always one)."""
    try:
        return _BY_SCHEME[scheme]
    except KeyError:
        raise ValueError(
            f"unknown source scheme {scheme!r}; the kinds are {', '.join(URI_SCHEMES)}"
        ) from None


def parse_uri(uri: Any, field_path: str = "spec.source.uri") -> Parsed:
    """`hf://org/name[:revision]`, `s3://bucket/prefix`, ... (URI_EXAMPLES), as its kind parses it."""
    if not isinstance(uri, str) or "://" not in uri:
        return None, [
            SpecError(field_path, "must be a URI such as hf://org/name", "write scheme://location", uri)
        ]
    scheme, _, rest = uri.partition("://")
    kind = _BY_SCHEME.get(scheme)
    if kind is None:
        fix = f"use one of {', '.join(s + '://' for s in URI_SCHEMES)}"
        return None, [SpecError(field_path, f"unsupported scheme {scheme!r}", fix, uri)]
    return kind.parse_uri(rest, uri, field_path)
