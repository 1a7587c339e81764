"""Every status of one object as the API server sends it on a watch: each write is one event, so a
test sees a short stretch (a download's few seconds) without racing it with polls."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client, watch

from praesto import names

Obj = dict[str, Any]


class StatusLog:
    """The statuses of one namespaced praesto object (by plural), collected until one has `phase`."""

    def __init__(self, api: client.ApiClient, plural: str, namespace: str, name: str, phase: str) -> None:
        self.statuses: list[Obj] = []
        self._watch = watch.Watch()
        self._api, self._plural, self._namespace, self._name = (
            client.CustomObjectsApi(api),
            plural,
            namespace,
            name,
        )
        self._phase = phase
        self._thread = threading.Thread(target=self._run, name=f"status-log-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stream = self._watch.stream(
            self._api.list_namespaced_custom_object, names.GROUP, names.VERSION, self._namespace,
            self._plural, field_selector=f"metadata.name={self._name}", timeout_seconds=120,
        )  # fmt: skip
        for event in stream:
            status = event["object"].get("status") or {}
            self.statuses.append(status)
            if status.get("phase") == self._phase:
                self._watch.stop()

    def wait(self, deadline: float = 60) -> list[Obj]:
        """The statuses seen, the last one in `phase`; fails when it did not come within `deadline`."""
        self._thread.join(deadline)
        if self._thread.is_alive():
            self._watch.stop()
            raise AssertionError(f"no {self._phase} status within {deadline}s: {self.statuses[-1:]}")
        assert self.statuses and self.statuses[-1].get("phase") == self._phase, self.statuses[-1:]
        return self.statuses
