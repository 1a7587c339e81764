"""The reflector's edge: `list_fn` / `watch_fn` / `hang_up` over one `kubernetes` list call.

Raw JSON both ways (`_preload_content=False`): no model classes are built for a
big Node list, and every resource arrives in the same dict shape the API server
sends. The watch is read line by line here rather than through
`kubernetes.watch.Watch`, which hides ERROR events' Status and retries a 410 on
its own; the reflector decides (`praesto.reflector`).
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import ReadTimeoutError

from praesto.reflector import CONNECT_SECONDS, IDLE_SECONDS, WATCH_SECONDS, Expired, Idle, Obj


class ListWatch:
    """List and watch what `list_call(*args, **query)` lists (e.g. `CoreV1Api.list_node`)."""

    def __init__(
        self,
        list_call: Callable[..., Any],
        *args: Any,
        watch_seconds: int = WATCH_SECONDS,
        idle_seconds: float = IDLE_SECONDS,
        **query: Any,
    ) -> None:
        self.list_call, self.args, self.query = list_call, args, query
        self.watch_seconds, self.idle_seconds = watch_seconds, idle_seconds
        self._response: Any = None

    def list(self) -> tuple[list[Obj], str]:
        response = self.list_call(
            *self.args, **self.query, _preload_content=False,
            _request_timeout=(CONNECT_SECONDS, self.idle_seconds),
        )  # fmt: skip
        body = json.loads(response.data)
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")

    def watch(self, resource_version: str) -> Iterator[Obj]:
        """Connects now; raises `Expired` on 410, and the events raise `Idle` on a silent connection."""
        try:
            response = self.list_call(
                *self.args, **self.query, watch=True, resource_version=resource_version,
                timeout_seconds=self.watch_seconds, allow_watch_bookmarks=True, _preload_content=False,
                # a read timeout: no byte (event or bookmark) for this long ends the watch
                _request_timeout=(CONNECT_SECONDS, self.idle_seconds),
            )  # fmt: skip
        except ApiException as err:
            if err.status == 410 or "too old resource version" in str(err.body or ""):
                raise Expired(f"HTTP {err.status} {err.reason}") from None
            raise
        self._response = response
        return _Events(response, self._forget)

    def _forget(self, response: Any) -> None:
        if self._response is response:
            self._response = None

    def hang_up(self) -> None:
        """Shut the open watch's socket so its reader returns now, not at its read timeout."""
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Events:
    """The decoded events of one open watch; `close()` returns its connection."""

    def __init__(self, response: Any, forget: Callable[[Any], None]) -> None:
        self.response, self.forget = response, forget
        self.lines = iter_resp_lines(response)

    def __iter__(self) -> _Events:
        return self

    def __next__(self) -> Obj:
        while True:
            try:
                line = next(self.lines)
            except ReadTimeoutError:
                raise Idle("no event and no bookmark within the read timeout") from None
            if line.strip():
                event: Obj = json.loads(line)
                return event

    def close(self) -> None:
        self.forget(self.response)
        with contextlib.suppress(Exception):
            self.response.close()
            self.response.release_conn()


def api_client_from_environment() -> client.ApiClient:
    """The Pod's own identity when running in a cluster, else the user's kubeconfig (local runs)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()
