"""Read a Pod's Praesto annotations into a checked list of mounts.

Every refusal names the annotation, the cause and the fix. Paths are
normalised (`//`, `.` and a trailing `/` removed) before the duplicate and
nesting checks, so `/models/` and `/models` count as the same place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from praesto import names

from .review import Refusal

MAX_MOUNTS = 16  # a Pod mounting more caches than this is almost surely a mistake
MAX_PATH = 1024
SCHEDULING_PREFERRED = "Preferred"
SCHEDULING_REQUIRED = "Required"
SCHEDULING_NONE = "None"
SCHEDULING_MODES = (SCHEDULING_PREFERRED, SCHEDULING_REQUIRED, SCHEDULING_NONE)

_MOUNTS = f"metadata.annotations[{names.ANNOTATION_MODEL_MOUNTS}]"
_LEGACY = f"metadata.annotations[{names.ANNOTATION_LEGACY_MODEL_CACHE}]"
_LEGACY_PATH = f"metadata.annotations[{names.ANNOTATION_LEGACY_MOUNT_PATH}]"
_TARGET = f"metadata.annotations[{names.ANNOTATION_TARGET_CONTAINER}]"
_SCHEDULING = f"metadata.annotations[{names.ANNOTATION_SCHEDULING}]"
_EXAMPLE = '[{"modelCache": "llama", "mountPath": "/models/llama"}]'


@dataclass(frozen=True)
class Mount:
    cache: str
    path: str  # normalised absolute path
    field: str  # the annotation entry naming the cache, for messages
    path_field: str  # the annotation entry giving the path


@dataclass(frozen=True)
class Wanted:
    """What the annotations ask for."""

    mounts: tuple[Mount, ...]
    target: str | None  # container name, None = first container
    scheduling: str


def wants_injection(annotations: Any) -> bool:
    """Cheap check for the fast path: does the Pod carry any of our annotations?"""
    return isinstance(annotations, dict) and any(
        key in annotations
        for key in (
            names.ANNOTATION_MODEL_MOUNTS,
            names.ANNOTATION_LEGACY_MODEL_CACHE,
            names.ANNOTATION_LEGACY_MOUNT_PATH,
            names.ANNOTATION_TARGET_CONTAINER,
            names.ANNOTATION_SCHEDULING,
        )
    )


def normalise_path(raw: Any, field: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise Refusal(field, "mountPath must be a non-empty string", "e.g. /models")
    if len(raw) > MAX_PATH or "\x00" in raw:
        raise Refusal(
            field, f"mountPath {raw[:64]!r} is too long or contains NUL", "use a short absolute path"
        )
    if not raw.startswith("/"):
        raise Refusal(
            field, f"mountPath {raw!r} is relative", f"use an absolute path such as /{raw.lstrip('./')}"
        )
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refusal(field, f"mountPath {raw!r} contains '..'", "write the path without '..'")
    if not parts:
        raise Refusal(field, "mountPath '/' would hide the container's root filesystem", "use e.g. /models")
    return "/" + "/".join(parts)


def overlaps(a: str, b: str) -> bool:
    """Same path, or one nested inside the other."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _cache_name(raw: Any, field: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise Refusal(
            field, "modelCache must be a non-empty string", "name a ModelCache in the Pod's namespace"
        )
    if not names.is_dns_label(raw):
        raise Refusal(
            field,
            f"{raw[:80]!r} is not a valid ModelCache name",
            "use the metadata.name of a ModelCache (lowercase letters, digits and '-', at most 63)",
        )
    return raw


def _parse_mounts(raw: Any) -> list[Mount]:
    if not isinstance(raw, str):
        raise Refusal(_MOUNTS, "must be a string holding a JSON list", f"e.g. {_EXAMPLE}")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise Refusal(_MOUNTS, f"is not valid JSON ({str(error)[:80]})", f"e.g. {_EXAMPLE}") from None
    if not isinstance(value, list) or not value:
        raise Refusal(_MOUNTS, "must be a non-empty JSON list of {modelCache, mountPath}", f"e.g. {_EXAMPLE}")
    if len(value) > MAX_MOUNTS:
        raise Refusal(
            _MOUNTS, f"lists {len(value)} mounts, more than the limit of {MAX_MOUNTS}", "mount fewer caches"
        )
    mounts = []
    for index, item in enumerate(value):
        field = f"{_MOUNTS}[{index}]"
        if not isinstance(item, dict):
            raise Refusal(field, "must be an object {modelCache, mountPath}", f"e.g. {_EXAMPLE}")
        unknown = sorted(str(k) for k in item if k not in ("modelCache", "mountPath"))
        if unknown:
            raise Refusal(
                field,
                f"unknown key(s) {', '.join(unknown)[:120]}",
                "only modelCache and mountPath are allowed",
            )
        cache = _cache_name(item.get("modelCache"), f"{field}.modelCache")
        path = normalise_path(item.get("mountPath"), f"{field}.mountPath")
        mounts.append(Mount(cache, path, field, f"{field}.mountPath"))
    return mounts


def _parse_legacy(annotations: dict[str, Any]) -> list[Mount]:
    if names.ANNOTATION_LEGACY_MODEL_CACHE not in annotations:
        raise Refusal(
            _LEGACY_PATH,
            f"is set without {names.ANNOTATION_LEGACY_MODEL_CACHE}",
            f"add {names.ANNOTATION_LEGACY_MODEL_CACHE}: <name>, or use {names.ANNOTATION_MODEL_MOUNTS}",
        )
    cache = _cache_name(annotations[names.ANNOTATION_LEGACY_MODEL_CACHE], _LEGACY)
    path = normalise_path(
        annotations.get(names.ANNOTATION_LEGACY_MOUNT_PATH, names.DEFAULT_MOUNT_PATH), _LEGACY_PATH
    )
    return [Mount(cache, path, _LEGACY, _LEGACY_PATH)]


def _check_unique(mounts: list[Mount]) -> None:
    for i, a in enumerate(mounts):
        for b in mounts[:i]:
            if a.cache == b.cache:
                raise Refusal(a.field, f"ModelCache {a.cache!r} is listed twice", "mount each cache once")
            if overlaps(a.path, b.path):
                cause = "duplicates" if a.path == b.path else "is nested with"
                raise Refusal(
                    a.path_field, f"{a.path} {cause} {b.path}", "give every cache its own separate path"
                )


def parse_annotations(annotations: dict[str, Any]) -> Wanted:
    """Check the annotations; raise `Refusal` naming the annotation at fault."""
    has_new = names.ANNOTATION_MODEL_MOUNTS in annotations
    has_legacy = (
        names.ANNOTATION_LEGACY_MODEL_CACHE in annotations
        or names.ANNOTATION_LEGACY_MOUNT_PATH in annotations
    )
    if has_new and has_legacy:
        raise Refusal(
            _MOUNTS,
            f"is set together with the legacy {names.ANNOTATION_LEGACY_MODEL_CACHE}/"
            f"{names.ANNOTATION_LEGACY_MOUNT_PATH} annotations",
            f"use only {names.ANNOTATION_MODEL_MOUNTS} and remove the legacy ones",
        )
    if not has_new and not has_legacy:
        present = _TARGET if names.ANNOTATION_TARGET_CONTAINER in annotations else _SCHEDULING
        raise Refusal(
            present,
            "is set but no model is requested",
            f"add {names.ANNOTATION_MODEL_MOUNTS} (or {names.ANNOTATION_LEGACY_MODEL_CACHE}), or remove it",
        )
    mounts = (
        _parse_mounts(annotations[names.ANNOTATION_MODEL_MOUNTS]) if has_new else _parse_legacy(annotations)
    )
    _check_unique(mounts)
    target = annotations.get(names.ANNOTATION_TARGET_CONTAINER)
    if target is not None and (not isinstance(target, str) or not target):
        raise Refusal(_TARGET, "must name a container", "set it to one of spec.containers[*].name")
    scheduling = annotations.get(names.ANNOTATION_SCHEDULING, SCHEDULING_PREFERRED)
    if scheduling not in SCHEDULING_MODES:
        raise Refusal(
            _SCHEDULING,
            f"{str(scheduling)[:40]!r} is not a scheduling mode",
            f"use one of {', '.join(SCHEDULING_MODES)}",
        )
    return Wanted(tuple(mounts), target, scheduling)
