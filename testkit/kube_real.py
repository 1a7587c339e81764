"""The real kube-apiserver for unit-level tests, with the fault proxy (kube_faults.py) in front.

One etcd + kube-apiserver per test process (`kube_plane`, session scope: under
`pytest -n 2` each xdist worker starts its own, ~3 s, so workers share no state
and need no lock), the chart's CRDs installed. No controller-manager: nothing
here needs one, and without it nothing but the test writes (no namespace
deletion, no garbage collection, no default ServiceAccount: tests create the
ServiceAccounts they use).

Binaries are those `make cluster-bin` built (build/cluster/current); without
them these tests skip, naming the target (in CI they fail: `make test` builds
them before the unit run).

Per test (the `kube` fixture, tests/conftest.py): a fresh `FaultProxy` (empty
request log, no faults) and a `RealKube` facade with the sync calls the tests use
(`create`, `get`, `list`, `patch`, `delete`, `wait_until`, `compact`), made as the
admin straight to the server, never through the proxy, so the request log holds
only the calls of the code under test; `identity()` makes a ServiceAccount token
with given `praesto.rbac` permissions, for code that must run as its own identity.
Namespaces are created on first use.

Isolation: tests keep their plain names (team-a, node-a) because no two tests share
a server at once (one per worker, tests in a worker run one after another), and
every test starts from a wiped server: the kinds tests write (`WIPED`) are deleted
in every namespace, finalizers first, and all Nodes and StorageClasses, whatever
the previous test left behind (it may have failed half-way). Module-scoped users
(tests/admission/test_admission_server.py) take `proxied(kube_plane)` once.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from praesto import names
from praesto.rbac import Permission
from testkit.chart_install import install_crds
from testkit.controlplane import ROOT, ControlPlane, ControlPlaneUnavailable, wait_for
from testkit.helm_chart import CRD_DIR
from testkit.kube_apply import Kube
from testkit.kube_faults import FaultProxy, RequestRecord

__all__ = ["RealKube", "RequestRecord", "proxied", "running_plane", "session_plane"]
Obj = dict[str, Any]
BINARIES = ROOT / "build" / "cluster" / "current"
GROUP_VERSIONS = {
    "": "v1",
    names.GROUP: names.VERSION,
    "events.k8s.io": "v1",
    "storage.k8s.io": "v1",
    "coordination.k8s.io": "v1",
    "rbac.authorization.k8s.io": "v1",
    "batch": "v1",
}
CLUSTER_SCOPED = {"nodes", "namespaces", "storageclasses", "persistentvolumes"}
SYSTEM_NAMESPACES = {"kube-system", "kube-public", "kube-node-lease"}
# What a test may leave behind, deleted before the next: (resource, has finalizers the tests set).
WIPED = (
    (f"{names.MODELCACHENODE_PLURAL}.{names.GROUP}", True),
    (f"modelcaches.{names.GROUP}", True),
    ("pods", False),
    ("secrets", False),
    ("configmaps", False),
    ("events", False),
    ("serviceaccounts", False),
    ("persistentvolumeclaims", True),
    ("leases.coordination.k8s.io", False),
)
WIPED_CLUSTER = ("nodes", "storageclasses.storage.k8s.io")


def plural_of(kind: str) -> str:
    lower = kind.lower()
    return lower + "es" if lower.endswith("s") else lower + "s"


class RealKube:
    """The running server for one test: the admin's sync calls, and the proxy's faults and log."""

    def __init__(self, plane: ControlPlane, admin: kubernetes.client.ApiClient, proxy: FaultProxy) -> None:
        self.plane = plane
        self.admin = admin
        self.proxy = proxy
        self._namespaces: set[str] = set()

    # ---- through the proxy: what the code under test uses ------------------

    def api_client(self, token: str = "") -> kubernetes.client.ApiClient:
        return self.proxy.api_client(token)

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def requests(self) -> list[RequestRecord]:
        return self.proxy.requests

    # The proxy's faults and watch controls, under the names the tests have always used.

    def fail_next(
        self, count: int = 1, status: int = 500, match: Callable[[RequestRecord], bool] | None = None
    ) -> None:
        self.proxy.fail_next(count, status, match)

    def clear_faults(self) -> None:
        self.proxy.clear_faults()

    def clear_requests(self) -> None:
        self.proxy.clear_requests()

    def drop_watches(self) -> None:
        self.proxy.drop_watches()

    def expire_watches(self) -> None:
        self.proxy.expire_watches()

    def wait_for_watches(self, count: int = 1, timeout: float = 10.0) -> None:
        self.proxy.wait_for_watches(count, timeout)

    def wait_for_watches_closed(self, timeout: float = 10.0) -> None:
        self.proxy.wait_for_watches_closed(timeout)

    def compact(self) -> None:
        """Every watch position taken so far is gone for good: etcd compacted, and a watch resumed
        from one gets 410 (the proxy answers it: the server's watch cache would still reach back)."""
        self.plane.compact_etcd()
        self.proxy.forget_history(int(self.call("GET", "/api/v1/namespaces")["metadata"]["resourceVersion"]))

    # ---- the admin, straight to the server ---------------------------------

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        response = self.admin.call_api(
            path,
            method,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            _return_http_data_only=True,
            _preload_content=False,
        )
        return json.loads(response.data or b"null")

    def path(
        self, resource: str, namespace: str | None = None, name: str | None = None, sub: str = ""
    ) -> str:
        plural, _, group = resource.partition(".")
        prefix = f"/apis/{group}/{GROUP_VERSIONS[group]}" if group else "/api/v1"
        if namespace and plural not in CLUSTER_SCOPED:
            prefix += f"/namespaces/{namespace}"
        return prefix + f"/{plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def ensure_namespace(self, namespace: str) -> None:
        if namespace in self._namespaces:
            return
        try:
            self.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        except ApiException as err:
            if err.status != 409:
                raise
        self._namespaces.add(namespace)

    def identity(self, namespace: str, name: str, permissions: Iterable[Permission]) -> str:
        """A token (TokenRequest) of ServiceAccount `namespace/name`, granted `permissions` cluster-wide:
        what a component's own identity is allowed, the real server's RBAC deciding every call."""
        account = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            self.create(account)
        except ApiException as err:
            if err.status != 409:
                raise
        role = f"praesto-test:{namespace}:{name}"
        rules = [
            {"apiGroups": [p.group], "resources": [p.resource], "verbs": list(p.verbs)} for p in permissions
        ]
        binding = {
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }
        for kind, body in (("clusterroles", {"rules": rules}), ("clusterrolebindings", binding)):
            # Replaced in place, never deleted first: agents already running under this identity
            # (several in one test) must not see a moment without their grant.
            path = f"/apis/rbac.authorization.k8s.io/v1/{kind}"
            try:
                current = self.call("GET", f"{path}/{role}")
            except ApiException as err:
                if err.status != 404:
                    raise
                self.call("POST", path, {"metadata": {"name": role}, **body})
                continue
            if any(current.get(k) != v for k, v in body.items()):
                if kind == "clusterrolebindings":  # roleRef cannot change; subjects and name do not here
                    continue
                meta = {"name": role, "resourceVersion": current["metadata"]["resourceVersion"]}
                self.call("PUT", f"{path}/{role}", {"metadata": meta, **body})
        self._wait_authorized(namespace, name, permissions)
        return self.plane.service_account_token(namespace, name)

    def _wait_authorized(self, namespace: str, name: str, permissions: Iterable[Permission]) -> None:
        """Until the API server's RBAC authorizer (fed by an informer) sees the new grant: a
        component started at once got 403s for a moment (peers not listed, the origin read twice)."""
        user = f"system:serviceaccount:{namespace}:{name}"
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
        asks = []
        for p in permissions:
            resource, _, subresource = p.resource.partition("/")
            for verb in p.verbs:
                attributes = {
                    "group": p.group,
                    "resource": resource,
                    "subresource": subresource,
                    "verb": verb,
                }
                asks.append({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                             "spec": {"user": user, "groups": groups, "resourceAttributes": attributes}})  # fmt: skip

        def allowed() -> bool:
            path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
            return all(self.call("POST", path, ask).get("status", {}).get("allowed") for ask in asks)

        wait_for(f"RBAC to grant {user} its permissions", allowed, 30.0, interval=0.05)

    def create(self, obj: Obj, *, with_status: bool = False) -> Obj:
        """Create `obj` (its namespace first, if need be); `with_status` writes its `.status` too."""
        group, _, _version = obj["apiVersion"].rpartition("/")
        plural = plural_of(obj["kind"])
        resource = f"{plural}.{group}" if group else plural
        namespace = (obj.get("metadata") or {}).get("namespace")
        if plural not in CLUSTER_SCOPED:
            namespace = namespace or "default"
            self.ensure_namespace(namespace)
        created: Obj = self.call("POST", self.path(resource, namespace), obj)
        if with_status and obj.get("status"):
            name = created["metadata"]["name"]
            created = self.patch(resource, name, {"status": obj["status"]}, namespace, "status")
        return created

    def get(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        try:
            got: Obj = self.call("GET", self.path(resource, namespace, name))
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return got

    def list(self, resource: str, namespace: str | None = None, label_selector: str = "") -> list[Obj]:
        query = {"labelSelector": label_selector} if label_selector else {}
        listed = self.call("GET", self.path(resource, namespace), query=query)
        kind = str(listed.get("kind", "")).removesuffix("List")
        api_version = listed.get("apiVersion", "")
        return [{"kind": kind, "apiVersion": api_version, **item} for item in listed.get("items") or []]

    def patch(
        self, resource: str, name: str, patch: Obj, namespace: str | None = None, subresource: str = ""
    ) -> Obj:
        """A JSON merge patch (RFC 7386: `None` deletes)."""
        path = self.path(resource, namespace, name, subresource)
        patched: Obj = self.call("PATCH", path, patch, content_type="application/merge-patch+json")
        return patched

    def delete(self, resource: str, name: str, namespace: str | None = None) -> Obj:
        deleted: Obj = self.call("DELETE", self.path(resource, namespace, name))
        return deleted

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
        wait_for(what or str(predicate), predicate, timeout, interval=0.05)

    def dump(self, resource: str) -> str:
        return "\n".join(json.dumps(o) for o in self.list(resource))

    # ---- isolation -------------------------------------------------------

    def wipe(self) -> None:
        """Delete what any test may have left: the next one starts from an empty server."""
        for resource, finalized in WIPED:
            held: set[str] = set()
            for obj in self.list(resource):
                meta = obj["metadata"]
                held.add(meta["namespace"])
                if finalized and meta.get("finalizers"):
                    unfinalized = {"metadata": {"finalizers": None}}
                    self.patch(resource, meta["name"], unfinalized, meta["namespace"])
            for namespace in held - SYSTEM_NAMESPACES:
                self.call("DELETE", self.path(resource, namespace), query={"gracePeriodSeconds": 0})
        for resource in WIPED_CLUSTER:
            if self.list(resource):
                self.call("DELETE", self.path(resource))


def missing_binaries() -> str:
    """Why the real API server cannot start here, or "" when it can."""
    missing = [b for b in ("etcd", "kube-apiserver") if not (BINARIES / b).exists()]
    if not missing:
        return ""
    return f"{BINARIES} has no {', '.join(missing)}: `make cluster-bin` builds the real API server"


@contextmanager
def running_plane(workdir: Path) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver in `workdir`, the chart's CRDs installed (for fixtures and benches)."""
    if reason := missing_binaries():
        raise ControlPlaneUnavailable(reason)
    shutil.rmtree(workdir, ignore_errors=True)
    plane = ControlPlane(workdir, BINARIES.resolve(), with_controllers=False)
    try:
        plane.start()
        install_crds(Kube(plane.admin()), sorted(CRD_DIR.glob("*.yaml")))
        yield plane
    finally:
        for component in plane.components.values():  # its etcd is a temp dir: no graceful shutdown
            component.kill()


@contextmanager
def proxied(plane: ControlPlane) -> Iterator[RealKube]:
    """The server wiped, behind a fresh fault proxy whose default identity is the admin."""
    pair = plane.admin_pair
    proxy = FaultProxy(
        plane.server, str(plane.ca_path), client_cert=(str(pair.cert_path), str(pair.key_path))
    )
    real = RealKube(plane, plane.admin(), proxy)
    proxy.on_expire = real.compact
    real.wipe()
    with proxy:
        yield real


def session_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The `kube_plane` fixture (tests/conftest.py): skips naming `make cluster-bin` without the
    binaries, fails so under CI (`make test` builds them before the unit run)."""
    if reason := missing_binaries():
        if os.environ.get("CI"):
            pytest.fail(f"API tests run on the real API server in CI: {reason}")
        pytest.skip(reason)
    with running_plane(tmp_path_factory.mktemp("kube-plane")) as plane:
        yield plane
