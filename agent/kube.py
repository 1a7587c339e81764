"""The agent's only door to the Kubernetes API (the real `kubernetes` client).

Calls made here are exactly those `praesto.rbac.AGENT` grants: list/watch/patch
ModelCacheNodes, patch their status, get one named Secret, list and watch one named
trust Secret or ConfigMap, create Events. The agent's other API callers (origin budget
Leases, peer tokens and reviews, the startup taint, a download Job's progress) get their
API groups from `Door`, built here; every call through it raises only the errors
`praesto.kubeerrors` maps, and no other agent module imports `kubernetes`.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.config.incluster_config import InClusterConfigLoader
from praesto.agent import logs

from praesto import names
from praesto.kubeerrors import APIError, Forbidden, Mapped, NotFound
from praesto.kubeerrors import is_transient as is_transient  # the agent's modules take these from here
from praesto.kubeerrors import short_error as short_error
from praesto.listwatch import ListWatch
from praesto.reflector import WATCH_SECONDS
from praesto.reflector import key_of as key_of  # the agent's modules take it from here

Obj = dict[str, Any]
G, V, P = names.GROUP, names.VERSION, names.MODELCACHENODE_PLURAL

log = logs.logger("praesto.agent.kube")

# Idle API connections the agent's one client keeps for reuse. Its watches, downloads, status writes
# and the peer server's identity checks (TokenReview and SubjectAccessReview per new peer) share it;
# the library's default (5 per CPU: 10 on a 2-CPU node) made urllib3 discard connections ("Connection
# pool is full") while seven followers asked a seeder at once, and each new one costs a TLS handshake.
KUBE_CONNECTIONS = 32


class NoApiConfig(Exception):
    """Neither the kubeconfig given nor the in-cluster service account configures a client."""


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """The agent's one client: from `kubeconfig`, else in-cluster; raises `NoApiConfig` (or OSError)."""
    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException as err:
        raise NoApiConfig(str(err)) from err
    configuration.connection_pool_maxsize = KUBE_CONNECTIONS
    return client.ApiClient(configuration)


class Door:
    """One client's API groups behind the error mapping (`praesto.kubeerrors.Groups`), for the
    collaborators that call the API themselves: budget Leases, peer tokens and reviews, the taint."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.client = api_client
        self.core = Mapped(client.CoreV1Api(api_client))
        self.custom = Mapped(client.CustomObjectsApi(api_client))
        self.coordination = Mapped(client.CoordinationV1Api(api_client))
        self.authentication = Mapped(client.AuthenticationV1Api(api_client))

    def sanitize(self, obj: Any) -> Any:
        """A model object the client returned as the plain dict the server sent."""
        return self.client.sanitize_for_serialization(obj)


def job_patch_call(credentials_dir: Path, env: Mapping[str, str]) -> Any:
    """`patch_namespaced_job` as the identity whose token and CA are in `credentials_dir` (a
    download Job's own ServiceAccount), errors mapped."""
    configuration = client.Configuration()
    InClusterConfigLoader(
        token_filename=str(credentials_dir / "token"),
        cert_filename=str(credentials_dir / "ca.crt"),
        environ=dict(env),
    ).load_and_set(configuration)
    return Mapped(client.BatchV1Api(client.ApiClient(configuration))).patch_namespaced_job


class SecretUnavailable(Exception):
    """The token Secret cannot be read yet; `message` says which and why (never its value)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class KubeApi:
    def __init__(self, api_client: client.ApiClient, node_name: str, watch_timeout: int = WATCH_SECONDS):
        self.custom = Mapped(client.CustomObjectsApi(api_client))
        self.core = Mapped(client.CoreV1Api(api_client))
        self.node_name = node_name
        self.watch_timeout = watch_timeout
        self.selector = f"{names.LABEL_NODE}={names.node_label_value(node_name)}"
        # this node's ModelCacheNodes, for the reflector (praesto.reflector) the agent runs
        self._nodes = ListWatch(
            self.custom.unmapped.list_cluster_custom_object, G, V, P, label_selector=self.selector,
            watch_seconds=watch_timeout,
        )  # fmt: skip

    def abort_watch(self) -> None:
        """Unblock a running `watch_nodes` (shutdown): closes its connection."""
        self._nodes.hang_up()

    # ---- ModelCacheNodes -------------------------------------------------

    def list_nodes(self) -> tuple[list[Obj], str]:
        return self._nodes.list()

    def watch_nodes(self, resource_version: str) -> Iterator[Obj]:
        """Raw watch events after `resource_version`; `praesto.reflector.Expired` on 410."""
        return self._nodes.watch(resource_version)

    def set_finalizers(self, obj: Obj, finalizers: list[str]) -> Obj:
        """Merge patch guarded by resourceVersion: never drops a finalizer another writer just added."""
        ns, name = key_of(obj)
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": obj["metadata"]["resourceVersion"]}}
        result: Obj = self.custom.patch_namespaced_custom_object(G, V, ns, P, name, body)
        return result

    def get_node(self, namespace: str, name: str) -> Obj | None:
        try:
            got: Obj = self.custom.get_namespaced_custom_object(G, V, namespace, P, name)
        except NotFound:
            return None
        return got

    def patch_status(self, namespace: str, name: str, patch: Obj) -> Obj | None:
        """Merge patch of the status subresource; None when the object is gone."""
        try:
            result: Obj = self.custom.patch_namespaced_custom_object_status(
                G, V, namespace, P, name, {"status": patch}
            )
        except NotFound:
            return None
        return result

    # ---- Secrets -----------------------------------------------------------

    def _read_secret_object(self, namespace: str, secret: str, missing_hint: str) -> Any:
        """One named Secret, with API errors turned into `SecretUnavailable` that say what to do."""
        where = f"Secret {namespace}/{secret}"
        try:
            return self.core.read_namespaced_secret(secret, namespace)
        except NotFound:
            raise SecretUnavailable(f"{where} not found; {missing_hint}") from None
        except Forbidden:
            raise SecretUnavailable(
                f"the node agent may not read {where} yet; the ModelCache grants it through Role "
                f"praesto-secret-reader-<cache>, the chart through its credentials Role "
                "(check the ModelCache's events if this persists)"
            ) from None
        except APIError as err:
            if not err.answered:  # no answer came (the server unreachable): raised, mapped
                raise
            raise SecretUnavailable(f"reading {where} failed with HTTP {err.status}; retrying") from None

    def read_secret(self, namespace: str, secret: str) -> tuple[dict[str, str], dict[str, str]]:
        """(decoded data, annotations) of one Secret, for object-store credentials; raises `SecretUnavailable`."""
        obj = self._read_secret_object(
            namespace,
            secret,
            "create it with the credential keys for this source "
            "(e.g. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY); the cache continues once it exists",
        )
        data = {k: base64.b64decode(v).decode(errors="replace") for k, v in (obj.data or {}).items()}
        return data, dict(obj.metadata.annotations or {}) if obj.metadata else {}

    def read_token(self, namespace: str, secret: str, key: str | None) -> str:
        """The token in one Secret key, held only by the caller; raises `SecretUnavailable`."""
        wanted = key or "HF_TOKEN"
        obj = self._read_secret_object(namespace, secret, f"create it with the token in key {wanted}")
        data = obj.data or {}
        for candidate in [key] if key else ["HF_TOKEN", "token"]:
            if candidate and candidate in data:
                return str(base64.b64decode(data[candidate]).decode().strip())
        raise SecretUnavailable(
            f"Secret {namespace}/{secret} has no key {wanted}; add the token under that key"
        )

    def read_secret_value(self, namespace: str, secret: str, key: str, what: str) -> bytes:
        """One key of one Secret (`what` it should hold, for messages); raises `SecretUnavailable`."""
        obj = self._read_secret_object(namespace, secret, f"create it with {what} in key {key}")
        data = obj.data or {}
        if key not in data:
            raise SecretUnavailable(
                f"Secret {namespace}/{secret} has no key {key}; add {what} under that key"
            )
        return base64.b64decode(data[key])

    def read_config_map_value(self, namespace: str, config_map: str, key: str, what: str) -> bytes:
        """One key of one ConfigMap (spec.verification trust material); raises `SecretUnavailable`,
        which the agent reports as WaitingForSecret, the same as for a Secret."""
        where = f"ConfigMap {namespace}/{config_map}"
        try:
            obj = self.core.read_namespaced_config_map(config_map, namespace)
        except NotFound:
            raise SecretUnavailable(f"{where} not found; create it with {what} in key {key}") from None
        except Forbidden:
            raise SecretUnavailable(
                f"the node agent may not read {where} yet; the ModelCache grants it through Role "
                "praesto-secret-reader-<cache> (check the ModelCache's events if this persists)"
            ) from None
        except APIError as err:
            if not err.answered:  # no answer came (the server unreachable): raised, mapped
                raise
            raise SecretUnavailable(f"reading {where} failed with HTTP {err.status}; retrying") from None
        data = obj.data or {}
        if key not in data:
            raise SecretUnavailable(f"{where} has no key {key}; add {what} under that key")
        return str(data[key]).encode()

    def trust_config_map_watch(self, namespace: str, name: str) -> ListWatch:
        """List and watch one named ConfigMap (spec.verification's trust material) by fieldSelector
        metadata.name: what the per-cache Role's resourceNames allows (hooks/local.py), the way the
        kubelet follows the ConfigMaps its Pods mount (agent/trust_material.py)."""
        return ListWatch(
            self.core.unmapped.list_namespaced_config_map, namespace,
            field_selector=f"metadata.name={name}", watch_seconds=self.watch_timeout,
        )  # fmt: skip

    def trust_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """One named Secret's data as stored (base64 values), None when it does not exist: the periodic
        GET of a trust Secret (agent/trust_material.py SecretRecheck; the Role grants `get` only).
        Other errors are raised as they come, so a 403 reads "(403)" as the Reflector's do."""
        try:
            obj = self.core.read_namespaced_secret(name, namespace)
        except NotFound:
            return None
        return dict(obj.data or {})

    # ---- Events ------------------------------------------------------------

    def emit_event(self, obj: Obj, type_: str, reason: str, message: str) -> None:
        """Best effort: an Event on the ModelCacheNode and one on its ModelCache, so both
        `kubectl describe modelcachenode` and `kubectl describe modelcache` show the transition."""
        ns, name = key_of(obj)
        involved = [(names.MODELCACHENODE_KIND, name, obj["metadata"].get("uid"), message)]
        owner = next((r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
        if owner is not None and owner.get("kind") == names.MODELCACHE_KIND:
            involved.append(
                (names.MODELCACHE_KIND, owner["name"], owner.get("uid"), f"node {self.node_name}: {message}")
            )
        for kind, involved_name, uid, text in involved:
            self._event(ns, kind, involved_name, uid, type_, reason, text)

    def _event(self, ns: str, kind: str, name: str, uid: Any, type_: str, reason: str, message: str) -> None:
        involved = {"apiVersion": names.API_VERSION, "kind": kind, "name": name, "namespace": ns, "uid": uid}
        self.event(ns, involved, type_, reason, message)

    def event(self, ns: str, involved: Obj, type_: str, reason: str, message: str) -> None:
        """Best effort: an Event in `ns` about `involved` (an involvedObject: Node, Pod, ModelCache...)."""
        name = str(involved.get("name") or "")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name[:200]}.{uuid.uuid4().hex[:12]}", "namespace": ns},
            "involvedObject": involved,
            "type": type_,
            "reason": reason,
            "message": message[:1000],
            "source": {"component": "praesto-agent", "host": self.node_name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(ns, event)
        except Exception as err:  # events are a courtesy; never fail reconcile on them
            log.warning("could not record event", extra={"namespace": ns, "object": name, "error": str(err)})
