"""The origin budget's door to the Kubernetes API: Leases in the release namespace, as dicts.

Exactly the calls `praesto.rbac.AGENT_ORIGIN_BUDGET` grants: list (by the budget's
label), get, create and update Leases in one namespace. A write carrying the
resourceVersion it read answers 409 when another node wrote first: `write`
returns False then, and the caller reads again. No call here retries by itself.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from praesto.agent.budget.slots import Lease

from praesto import names

_TYPE = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}


class LeaseApi:
    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.leases = client.CoordinationV1Api(api)
        self.namespace = namespace

    def list(self) -> dict[str, Lease]:
        """Every budget Lease (slots and hosts) by name: one request, however many nodes wait."""
        resp = self.leases.list_namespaced_lease(
            self.namespace, label_selector=names.LABEL_ORIGIN_BUDGET, _preload_content=False
        )
        items: list[Lease] = json.loads(resp.data).get("items") or []
        return {str(o["metadata"]["name"]): o for o in items}

    def get(self, name: str) -> Lease | None:
        try:
            resp = self.leases.read_namespaced_lease(name, self.namespace, _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        lease: Lease = json.loads(resp.data)
        return lease

    def write(self, body: Lease) -> Lease | None:
        """Create (no resourceVersion) or update (with it) `body`; None when another writer came first."""
        meta: dict[str, Any] = body["metadata"]
        full = {**_TYPE, **body, "metadata": {**meta, "namespace": self.namespace}}
        try:
            if meta.get("resourceVersion"):
                resp = self.leases.replace_namespaced_lease(
                    meta["name"], self.namespace, full, _preload_content=False
                )
            else:
                resp = self.leases.create_namespaced_lease(self.namespace, full, _preload_content=False)
        except ApiException as err:
            if err.status == 409:  # Conflict (stale resourceVersion) or AlreadyExists (created meanwhile)
                return None
            raise
        written: Lease = json.loads(resp.data)
        return written
