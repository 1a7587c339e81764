"""The Kubernetes client's errors, mapped once into the few a caller acts on.

The model is kopf's own hierarchy (nolar/kopf 1.44.6, kopf/_cogs/clients/errors.py): the client
library may change, so no module outside a process's door names its exceptions; a caller catches
`NotFound`, `Conflict`, `Forbidden`, `Gone` or `Transient` (repeat later: 429, 5xx, the server
unreachable), or the `APIError` they all are. Unlike kopf, a connection error (urllib3's, as the
`kubernetes` client raises it) becomes `Transient` too: every caller here retries it like a 503.

What the client raised stays on the error (`origin`, also the `__cause__`), and everything a log
line shows of an error reads as before the mapping: `str(err)` is the client's text, and the
mapped class carries the client exception's class name (`ApiException`, `MaxRetryError`), since
many lines and status messages print `type(err).__name__`. `short_error` words it for logs.

`Mapped` puts a client API group (`CoreV1Api(...)`) behind the mapping: its calls raise only
these. `ListWatch` (praesto/listwatch.py) takes the unmapped list call: it maps its own (410 to
`Expired`), and the Reflector words the rest.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import DynamicApiError


class APIError(Exception):
    """An API call failed; `status` (None when no answer came), `reason` and `message` for logs."""

    status: int | None = None

    def __init__(self, origin: BaseException, status: int | None, reason: str, message: str) -> None:
        super().__init__(str(origin))
        self.origin, self.status, self.reason, self.message = origin, status, reason, message

    @property
    def answered(self) -> bool:
        """The server answered with an error (not: no answer came, a connection error)."""
        return isinstance(self.origin, ApiException | DynamicApiError)


class NotFound(APIError):
    """404: the object (or its namespace) does not exist."""


class Conflict(APIError):
    """409: another writer came first (a stale resourceVersion, or AlreadyExists)."""


class Forbidden(APIError):
    """403: RBAC (or an admission policy) refuses this identity the call."""


class Gone(APIError):
    """410: the resourceVersion asked for is compacted away."""


class Transient(APIError):
    """Worth repeating later: 429, 5xx, no status, or the server unreachable (a connection error)."""


def _mapped_class(status: int | None) -> type[APIError]:
    if status in (0, None, 429) or int(status) >= 500:
        return Transient
    return {404: NotFound, 409: Conflict, 403: Forbidden, 410: Gone}.get(int(status), APIError)


_NAMED: dict[tuple[type[APIError], str], type[APIError]] = {}


def _named(base: type[APIError], name: str) -> type[APIError]:
    """`base` under the client exception's class name (see the module docstring); one class each."""
    made = _NAMED.get((base, name))
    if made is None:
        made = _NAMED.setdefault(
            (base, name), type(name, (base,), {"__module__": __name__, "__qualname__": name})
        )
    return made


def _message(err: ApiException | DynamicApiError) -> str:
    """The Status message of the answer, never its whole body (a body may echo an object)."""
    body = err.body
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if isinstance(body, str) and body.startswith("{"):
        try:
            status = json.loads(body)
        except ValueError:
            return str(err.reason or "")
        if isinstance(status, dict) and status.get("kind") == "Status":
            return str(status.get("message") or "")[:300]
    return str(err.reason or "")


def mapped(err: BaseException) -> APIError | None:
    """`err` as one of ours, or None when it is no API error (a bug, an OSError: raised as is)."""
    if isinstance(err, APIError):
        return err
    if isinstance(err, ApiException | DynamicApiError):
        status = err.status
        cls = _mapped_class(status)
        return _named(cls, type(err).__name__)(err, status, str(err.reason or ""), _message(err))
    if isinstance(err, urllib3.exceptions.HTTPError):
        return _named(Transient, type(err).__name__)(err, None, type(err).__name__, str(err)[:200])
    return None


@contextmanager
def translated() -> Iterator[None]:
    """Raise the client's API errors inside as `APIError`s (the client's chained as the cause)."""
    try:
        yield
    except Exception as err:
        ours = mapped(err)
        if ours is None or ours is err:
            raise
        raise ours from err


class Mapped:
    """A client API group whose every call raises only the errors above; `unmapped` is the group."""

    def __init__(self, group: Any) -> None:
        self.unmapped = group

    def __getattr__(self, name: str) -> Callable[..., Any]:
        call = getattr(self.unmapped, name)

        @functools.wraps(call)
        def mapped_call(*args: Any, **kwargs: Any) -> Any:
            with translated():
                return call(*args, **kwargs)

        return mapped_call


class Groups(Protocol):
    """What a process's door hands the collaborators it builds: the API groups they call, mapped.
    (The agent's is `praesto.agent.kube.Door`; the budget and peer packages sit below it.)"""

    core: Mapped
    custom: Mapped
    coordination: Mapped
    authentication: Mapped

    def sanitize(self, obj: Any) -> Any: ...


def is_transient(err: BaseException) -> bool:
    """An API call worth repeating later: the server unreachable, restarting or overloaded (5xx, 429)."""
    if isinstance(err, APIError):
        return isinstance(err, Transient)
    if isinstance(err, ApiException):
        return err.status in (0, None, 429) or int(err.status) >= 500
    return isinstance(err, urllib3.exceptions.HTTPError | OSError)


def short_error(err: BaseException) -> str:
    """One line for logs and status: never an API response body (it may echo a Secret's name or data)."""
    if isinstance(err, APIError):
        err = err.origin
    if isinstance(err, ApiException):
        return f"HTTP {err.status} {err.reason}"
    return f"{type(err).__name__}: {str(err)[:200]}"
