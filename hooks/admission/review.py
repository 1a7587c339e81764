"""AdmissionReview v1 envelope: read the request, build allow/deny/patch responses.

Both webhooks answer in the same shape; a refusal is always HTTP 200 with
`allowed: false` and a Kubernetes-style status, so the API server shows our
message to the user verbatim.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"

# Status codes for refusals: the apiserver returns them to the client as-is.
BAD_REQUEST = 400  # the object or its annotations are malformed
FORBIDDEN = 403  # well-formed, but not allowed in the current state (unknown or failed cache)
UNAVAILABLE = 503  # we could not read the API; retrying later can succeed

_REASONS = {BAD_REQUEST: "BadRequest", FORBIDDEN: "Forbidden", UNAVAILABLE: "ServiceUnavailable"}


class Refusal(Exception):
    """A reason to deny: the field (or input) at fault, what is wrong, how to fix it."""

    def __init__(self, field: str, cause: str, fix: str, code: int = BAD_REQUEST) -> None:
        self.field = field
        self.cause = cause
        self.fix = fix
        self.code = code
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return f"{self.field}: {self.cause}; {self.fix}"


@dataclass(frozen=True)
class UserInfo:
    """Who made the request (`request.userInfo`), as the API server authenticated them."""

    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)


def _user_info(raw: Any) -> UserInfo:
    if not isinstance(raw, dict):
        return UserInfo()
    groups = raw.get("groups")
    extra = raw.get("extra")
    return UserInfo(
        username=str(raw.get("username") or ""),
        uid=str(raw.get("uid") or ""),
        groups=tuple(str(g) for g in groups) if isinstance(groups, list) else (),
        extra={
            str(k): [str(v) for v in values]
            for k, values in (extra.items() if isinstance(extra, dict) else ())
            if isinstance(values, list)
        },
    )


@dataclass(frozen=True)
class Request:
    """The parts of `AdmissionReview.request` both webhooks use."""

    uid: str
    operation: str
    namespace: str
    obj: dict[str, Any]
    old: dict[str, Any] | None
    dry_run: bool
    user: UserInfo = field(default_factory=UserInfo)


class MalformedReview(ValueError):
    """The body is not an AdmissionReview we can answer; `uid` is set when it was recoverable."""

    def __init__(self, message: str, uid: str | None) -> None:
        self.uid = uid
        super().__init__(message)


def parse_review(body: Any) -> Request:
    """Validate the envelope; raise `MalformedReview` (with the uid when readable)."""
    request = body.get("request") if isinstance(body, dict) else None
    if not isinstance(request, dict):
        raise MalformedReview("body must be an AdmissionReview with a request object", None)
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("request.uid is missing", None)
    if body.get("apiVersion") not in (API_VERSION, None) or body.get("kind") not in (KIND, None):
        raise MalformedReview(f"only {KIND} {API_VERSION} is served", uid)
    obj = request.get("object")
    old = request.get("oldObject")
    operation = request.get("operation")
    if not isinstance(operation, str):
        raise MalformedReview("request.operation is missing", uid)
    if obj is not None and not isinstance(obj, dict):
        raise MalformedReview("request.object must be an object", uid)
    if old is not None and not isinstance(old, dict):
        raise MalformedReview("request.oldObject must be an object", uid)
    namespace = request.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        meta = (obj or old or {}).get("metadata")
        namespace = meta.get("namespace", "") if isinstance(meta, dict) else ""
    return Request(
        uid=uid,
        operation=operation,
        namespace=namespace if isinstance(namespace, str) else "",
        obj=obj or {},
        old=old,
        dry_run=bool(request.get("dryRun")),
        user=_user_info(request.get("userInfo")),
    )


def _envelope(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def allow(uid: str, warnings: list[str] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if warnings:
        response["warnings"] = warnings
    return _envelope(response)


def allow_patch(uid: str, patch: list[dict[str, Any]], warnings: list[str] | None = None) -> dict[str, Any]:
    if not patch:
        return allow(uid, warnings)
    review = allow(uid, warnings)
    review["response"]["patchType"] = "JSONPatch"
    review["response"]["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    return review


def deny(uid: str, refusal: Refusal, warnings: list[str] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "uid": uid,
        "allowed": False,
        "status": {
            "code": refusal.code,
            "reason": _REASONS.get(refusal.code, "Invalid"),
            "message": refusal.message,
        },
    }
    if warnings:
        response["warnings"] = warnings
    return _envelope(response)


def json_pointer(*parts: str | int) -> str:
    """RFC 6901 pointer: `~` becomes `~0` and `/` becomes `~1` (label keys contain `/`)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
