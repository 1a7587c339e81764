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

from praesto import names
from praesto.kinds import COMMIT_PATTERN as COMMIT_PATTERN
from praesto.kinds import FORMS
from praesto.kinds import HF_REPO_PATTERN as HF_REPO_PATTERN
from praesto.kinds import MAX_PATTERN_CHARS as MAX_PATTERN_CHARS
from praesto.kinds import MAX_PATTERNS as MAX_PATTERNS
from praesto.kinds import MS_REPO_PATTERN as MS_REPO_PATTERN
from praesto.kinds import SOURCE_FORMS as SOURCE_FORMS
from praesto.kinds import URI_EXAMPLES as URI_EXAMPLES
from praesto.kinds import URI_SCHEMES as URI_SCHEMES
from praesto.kinds import Source as Source
from praesto.kinds import parse_oci_reference as parse_oci_reference
from praesto.kinds import parse_uri as _parse_uri
from praesto.privileges import privilege_errors
from praesto.quantity import QuantityError, parse_duration, parse_quantity
from praesto.refs import SECRET_KEY as _SECRET_KEY
from praesto.refs import SecretRef as SecretRef
from praesto.refs import SpecError as SpecError
from praesto.refs import check_secret_name as _check_secret_name
from praesto.updatestrategy import UpdateStrategy as UpdateStrategy
from praesto.updatestrategy import parse_update_strategy
from praesto.verification import Verification, parse_verification

_LABEL_KEY_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


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
    """`hf://org/name[:revision]`, `s3://bucket/prefix`, ... : each kind's own parser (praesto/kinds.py)."""
    return _parse_uri(uri, field_path)


_ONE_OF = ", ".join(f"source.{form}" for form in SOURCE_FORMS[:-1]) + f" or source.{SOURCE_FORMS[-1]}"


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
        errors.append(SpecError("spec.source", cause, f"set one of {_ONE_OF}"))
        return None
    form = FORMS.get(forms[0])
    if form is not None and form.parse_form is not None:
        parsed = form.parse_form(source[forms[0]], errors)
    else:
        parsed, uri_errors = parse_uri(source["uri"])
        errors.extend(uri_errors)
    secret = source.get("secretRef")
    if parsed is not None and secret is not None:
        if parsed.secret_ref is not None:
            errors.append(
                SpecError(
                    "spec.source.secretRef",
                    f"source.{forms[0]}.token and source.secretRef are both set",
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
                parsed = parsed.with_secret(SecretRef(secret["name"], key))
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
