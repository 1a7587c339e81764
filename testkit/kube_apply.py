"""Create-or-update arbitrary objects on a real API server through discovery (the dynamic client).

What `kubectl apply --server-side` does, for fixtures and for the Metacontroller
driver: one field manager per caller, conflicts forced only where the caller
says it owns the fields.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError
from kubernetes.dynamic.resource import Resource

Obj = dict[str, Any]


class Kube:
    """A dynamic client bound to one identity (whatever `api` authenticates as)."""

    def __init__(self, api: client.ApiClient, field_manager: str = "praesto-tests") -> None:
        self.api = api
        self.dynamic = DynamicClient(api)
        self.field_manager = field_manager

    def resource(self, api_version: str, kind: str) -> Resource:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def resource_by_plural(self, api_version: str, plural: str) -> Resource:
        return self.dynamic.resources.get(api_version=api_version, name=plural)

    def apply(self, obj: Obj, *, force: bool = True) -> Obj:
        resource = self.resource(obj["apiVersion"], obj["kind"])
        namespace = obj["metadata"].get("namespace") if resource.namespaced else None
        result = resource.server_side_apply(
            body=obj, namespace=namespace, field_manager=self.field_manager, force_conflicts=force
        )
        out: Obj = result.to_dict()
        return out

    def create(self, obj: Obj) -> Obj:
        resource = self.resource(obj["apiVersion"], obj["kind"])
        namespace = obj["metadata"].get("namespace") if resource.namespaced else None
        out: Obj = resource.create(body=obj, namespace=namespace).to_dict()
        return out

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        resource = self.resource(api_version, kind)
        try:
            out: Obj = resource.get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None
        return out

    def list(
        self, api_version: str, kind: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[Obj]:
        resource = self.resource(api_version, kind)
        listed = resource.get(namespace=namespace, label_selector=label_selector)
        return [item.to_dict() for item in listed.items]

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None, **kw: Any) -> None:
        resource = self.resource(api_version, kind)
        try:
            resource.delete(name=name, namespace=namespace, **kw)
        except NotFoundError:
            return
