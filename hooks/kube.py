"""The hooks package's one door to the Kubernetes API (the real `kubernetes` client).

praesto-hooks (the admission lookups, the credentials broker), praesto-orphans (the orphan
releaser) and `praesto uninstall-check` reach the API server through `Door`: its API groups raise
only the errors `praesto.kubeerrors` maps (`NotFound`, `Conflict`, `Forbidden`, `Transient`, ...),
and no other module of `praesto.hooks` imports `kubernetes`. A reflector's list call goes to
`ListWatch` unmapped (`Door.list_call`): the edge maps 410 to `Expired` itself.

Calls keep the timeouts their callers give (`_request_timeout`); the door adds none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from praesto.kubeerrors import APIError, Conflict, Forbidden, Mapped, NotFound, Transient

__all__ = [
    "APIError",
    "ApiClient",
    "Conflict",
    "Door",
    "Forbidden",
    "NoApiConfig",
    "NotFound",
    "Transient",
    "configured_client",
    "unanswered",
]

ApiClient = client.ApiClient  # what a caller (or a test) hands the door: one configured client


class NoApiConfig(Exception):
    """Neither the Pod's in-cluster configuration nor a kubeconfig was found."""


class Door:
    """The API groups the hooks' processes call, each behind the error mapping."""

    def __init__(self, api: client.ApiClient | None = None) -> None:
        self.api = api if api is not None else configured_client()
        self.core = Mapped(client.CoreV1Api(self.api))
        self.custom = Mapped(client.CustomObjectsApi(self.api))
        self.storage = Mapped(client.StorageV1Api(self.api))
        self.authentication = Mapped(client.AuthenticationV1Api(self.api))

    def list_call(self, group: Mapped, method: str) -> Callable[..., Any]:
        """`group`'s list method unmapped, for `praesto.listwatch.ListWatch` (it maps 410 itself)."""
        call: Callable[..., Any] = getattr(group.unmapped, method)
        return call

    def sanitize(self, obj: Any) -> Any:
        """A client model object as the plain JSON dict the API server sent."""
        return self.api.sanitize_for_serialization(obj)

    def review_token(self, token: str, audiences: list[str], timeout: float) -> Any:
        """A TokenReview of `token` for `audiences`; its status as a dict."""
        review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=audiences))
        made = self.authentication.create_token_review(review, _request_timeout=timeout)
        return self.sanitize(made).get("status") or {}


def unanswered(err: APIError) -> bool:
    """No answer came at all (the server unreachable, a connection cut), as opposed to an HTTP status."""
    return not isinstance(err.origin, ApiException)


def configured_client() -> client.ApiClient:
    """In-cluster (a Pod's ServiceAccount), else KUBECONFIG / ~/.kube/config (a developer's run)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except config.ConfigException as err:
            raise NoApiConfig(str(err)) from None
    return client.ApiClient()
