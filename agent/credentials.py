"""Which credentials a download of a copy uses: the node agent's credential policy.

Built once, at the process edge, from the chart's settings (`from_env`), and handed
to every job; the Secrets it names are read per attempt, so Secret edits apply
without a restart. The cache's own secretRef wins; else, for namespaces the platform
admin opted in (chart credentials.namespaces) and sources inside credentials.sources,
the chart's credentials Secret (credentials.secretRef) or the workload identity; else
none (anonymous). The namespace and source rule is the one the hooks apply to the
PVC-mode Job too (praesto/credscope.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from praesto.agent.broker_client import Broker
from praesto.agent.copies import CacheRef
from praesto.agent.download.api import SignaturePolicy
from praesto.agent.download.origin import REGISTRY_LOGIN, TOKEN
from praesto.agent.download.origins import origin_for
from praesto.agent.kube import KubeApi, SecretUnavailable
from praesto.agent.trust_material import Material, Unreadable

from praesto import credscope, store, trustpolicy
from praesto.verification import BASE as VERIFICATION_FIELD
from praesto.verification import Verification

CLUSTER_SECRET_ENV = "PRAESTO_CREDENTIALS_SECRET"  # noqa: S105 - chart credentials.secretRef: "namespace/name"
# chart credentials.namespaces, comma-separated: who may use the cluster's credentials at all
CLUSTER_CREDENTIALS_NAMESPACES_ENV = credscope.ENV_NAMESPACES
# chart credentials.sources, comma-separated URI prefixes: what the cluster's credentials may fetch
CLUSTER_CREDENTIALS_SOURCES_ENV = credscope.ENV_SOURCES

# (token, client settings or registry login, where they came from for messages): the kind's
# CredentialShape (download/origin.py) says which
Credentials = tuple[str | None, dict[str, str] | None, str]


class SecretReader(Protocol):
    """Where a cache's own credentials Secret is read: the credentials broker, for this node's copy
    only (agent/broker_client.py CacheObjects), or the API directly (`KubeApi`, no broker configured)."""

    def read_secret(self, namespace: str, secret: str) -> tuple[dict[str, str], dict[str, str]]: ...

    def read_token(self, namespace: str, secret: str, key: str | None) -> str: ...

    def read_secret_value(self, namespace: str, secret: str, key: str, what: str) -> bytes: ...


@dataclass(frozen=True)
class CredentialPolicy:
    scope: credscope.CredentialScope = field(default_factory=credscope.CredentialScope)
    cluster_secret: tuple[str, str] | None = None  # (namespace, name) of the chart's Secret
    # the platform's signing trust by name (chart verification.trust, praesto/trustpolicy.py)
    cluster_trust: Mapping[str, trustpolicy.ClusterTrust] = field(default_factory=dict)
    # the credentials broker (the chart always sets --credentials-broker): a cache's own Secret comes
    # from it, for this node's copy only; None reads it with the agent's own identity (development)
    broker: Broker | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str], trust_dir: str | None = None) -> CredentialPolicy:
        """The chart's credentials settings, and the platform's signing trust in `trust_dir` (--trust-dir,
        the mounted verification.trust ConfigMap, read again whenever the kubelet updates it:
        trustpolicy.TrustDir; ValueError when it is missing)."""
        secret = env.get(CLUSTER_SECRET_ENV, "")
        namespace, _, name = secret.partition("/")
        return cls(
            credscope.CredentialScope.from_env(env),
            (namespace, name) if "/" in secret else None,
            trustpolicy.TrustDir(trust_dir) if trust_dir else {},
        )

    def entitled(self, namespace: str, uri: str = "") -> bool:
        """Whether a cache of `namespace` without a secretRef may use the cluster's Secret or identity
        for source `uri`: the chart's credentials.namespaces and .sources."""
        return self.scope.entitled(namespace, uri)

    def identity_allowed(self, ref: CacheRef) -> bool:
        """A cache that names its own Secret uses only it, never the cluster's identity; and the
        cluster's serve only the namespaces the platform admin opted in."""
        return ref.source.secret_ref is None and self.entitled(ref.namespace, ref.source.uri)

    def tenant_secrets(self, kube: KubeApi, ref: CacheRef) -> SecretReader:
        """Where `ref`'s own credentials Secret is read: the broker when configured, else `kube`."""
        return self.broker.objects(ref.cache) if self.broker is not None else kube

    def credentials(self, kube: KubeApi, ref: CacheRef) -> Credentials:
        """(token, client settings or login, where from) for one attempt (Secrets read now): the cache's
        own through `tenant_secrets`, the chart's with the agent's identity (its credentials Role)."""
        source, secret_ref = ref.source, ref.source.secret_ref
        tenant = self.tenant_secrets(kube, ref)
        shape = origin_for(source.scheme).credential  # what this kind's credential is (download/origin.py)
        if secret_ref is not None and shape.form == TOKEN:
            return tenant.read_token(ref.namespace, secret_ref.name, secret_ref.key or shape.key), None, ""
        if secret_ref is not None and shape.form == REGISTRY_LOGIN:  # a kubernetes.io/dockerconfigjson Secret
            key = secret_ref.key or str(shape.key)
            what = "a Docker config JSON (kubectl create secret docker-registry)"
            login = tenant.read_secret_value(ref.namespace, secret_ref.name, key, what).decode()
            return None, {shape.cluster_key: login}, f"Secret {ref.namespace}/{secret_ref.name}"
        if secret_ref is not None:
            namespace, name = ref.namespace, secret_ref.name
        elif ref.namespace not in self.scope.namespaces:
            return (
                None,
                None,
                (
                    f"no credentials (namespace {ref.namespace} is not opted in to the cluster's "
                    "credentials: the chart's credentials.namespaces; or give the cache its own secretRef)"
                ),
            )
        elif not self.entitled(ref.namespace, source.uri):
            return (
                None,
                None,
                (
                    f"no credentials ({source.uri} is outside the sources the cluster's credentials may "
                    "fetch: the chart's credentials.sources; or give the cache its own secretRef)"
                ),
            )
        elif self.cluster_secret is not None:
            namespace, name = self.cluster_secret
        else:
            return None, None, "no credentials"
        data, annotations = (tenant if secret_ref is not None else kube).read_secret(namespace, name)
        where = f"Secret {namespace}/{name}"
        if shape.form == REGISTRY_LOGIN:  # the cluster's Secret may hold a registry login too
            shared = data.get(shape.cluster_key)
            return None, ({shape.cluster_key: shared} if shared else None), where
        if shape.form == TOKEN:  # one key of the Secret's settings
            return data.get(shape.cluster_key, "").strip() or None, None, where
        assert shape.from_secret is not None  # CredentialShape checks a SETTINGS shape has both
        return None, shape.from_secret(data, annotations), where


def _cluster_policy(
    wanted: Verification, cluster_trust: Mapping[str, trustpolicy.ClusterTrust]
) -> SignaturePolicy | None:
    """The policy of a platform trust name as this agent holds it now; None when it holds none."""
    entry = cluster_trust.get(wanted.cluster_trust)
    if entry is None or entry.method != wanted.method:
        return None
    origin = (
        f"the platform's trust {wanted.cluster_trust!r} ({VERIFICATION_FIELD}.{wanted.method}.clusterTrust)"
    )
    if wanted.method == "publicKey":
        return SignaturePolicy(wanted.method, wanted.path, origin, public_key=entry.pem)
    return SignaturePolicy(wanted.method, wanted.path, origin, certificates=(entry.pem,))


def _sigstore_policy(wanted: Verification) -> SignaturePolicy:
    return SignaturePolicy(
        wanted.method,
        wanted.path,
        f"{VERIFICATION_FIELD}.sigstore",
        identity=wanted.identity,
        oidc_issuer=wanted.oidc_issuer,
    )


def _material_origin(namespace: str, wanted: Verification) -> str:
    if wanted.secret_ref is not None:
        where = f"Secret {namespace}/{wanted.secret_ref.name} key {wanted.secret_ref.key}"
    elif wanted.config_map_ref is not None:
        where = f"ConfigMap {namespace}/{wanted.config_map_ref.name} key {wanted.config_map_ref.key}"
    else:
        raise SecretUnavailable(f"{VERIFICATION_FIELD}.{wanted.method} names no Secret or ConfigMap")
    return f"{where} ({VERIFICATION_FIELD}.{wanted.method})"


def _material_policy(wanted: Verification, origin: str, pem: bytes) -> SignaturePolicy:
    """The policy of PEM material read from the cache's namespace: the download and the reconcile
    build it alike, so both compute the same fingerprint (SignaturePolicy.trust)."""
    if wanted.method == "publicKey":
        return SignaturePolicy(wanted.method, wanted.path, origin, public_key=pem)
    return SignaturePolicy(wanted.method, wanted.path, origin, certificates=(pem,))


def required_signature(
    ref: CacheRef,
    cluster_trust: Mapping[str, trustpolicy.ClusterTrust],
    namespace_material: Callable[[str, Verification], Material] | None = None,
) -> store.RequiredSignature | None:
    """What a copy of `ref` must have been verified with, and under which trust as the agent holds
    it now: the platform's trust (re-read when its volume changed), a sigstore identity, or the
    Secret or ConfigMap of the cache's namespace as `namespace_material` follows it
    (agent/trust_material.py: its watch). Material gone or unreadable is no trust (TRUST_WITHDRAWN,
    the origin saying why); material not known yet compares method and path only.
    The reconcile compares copies against it at every pass (store.copy_mismatch)."""
    wanted = ref.verification
    if wanted is None:
        return None
    if wanted.cluster_trust:
        policy = _cluster_policy(wanted, cluster_trust)
        if policy is None:
            origin = f"the platform's trust {wanted.cluster_trust!r}"
            return store.RequiredSignature(wanted.method, wanted.path, store.TRUST_WITHDRAWN, origin)
        return policy.required
    if wanted.method == "sigstore":
        return _sigstore_policy(wanted).required
    found = namespace_material(ref.namespace, wanted) if namespace_material is not None else None
    if isinstance(found, bytes):
        return _material_policy(wanted, _material_origin(ref.namespace, wanted), found).required
    if isinstance(found, Unreadable):
        origin = f"{_material_origin(ref.namespace, wanted)}, {found.why},"
        return store.RequiredSignature(wanted.method, wanted.path, store.TRUST_WITHDRAWN, origin)
    return store.RequiredSignature(wanted.method, wanted.path)


def signature_policy(
    kube: KubeApi, ref: CacheRef, cluster_trust: Mapping[str, trustpolicy.ClusterTrust]
) -> SignaturePolicy | None:
    """The signature this copy's model must carry, its trust material read now from the cache's own
    Secret (the per-cache grant, hooks/local.py), held in memory for this attempt only, or the
    platform's (`cluster_trust`, chart verification.trust, as mounted now)."""
    wanted = ref.verification
    if wanted is None:
        return None
    if wanted.cluster_trust:
        policy = _cluster_policy(wanted, cluster_trust)
        if policy is None:
            raise SecretUnavailable(
                f"{VERIFICATION_FIELD}.{wanted.method}.clusterTrust {wanted.cluster_trust!r}: this node agent "
                "has no such platform trust (withdrawn, or not yet mounted here); add it to the chart's "
                "verification.trust (or check --trust-dir)"
            )
        return policy
    if wanted.method == "sigstore":  # no material to read
        return _sigstore_policy(wanted)
    what = "the PEM public key" if wanted.method == "publicKey" else "the PEM CA certificates"
    origin = _material_origin(ref.namespace, wanted)
    if wanted.secret_ref is not None:
        pem = kube.read_secret_value(ref.namespace, wanted.secret_ref.name, str(wanted.secret_ref.key), what)
    else:
        assert wanted.config_map_ref is not None  # _material_origin raised otherwise
        pem = kube.read_config_map_value(
            ref.namespace, wanted.config_map_ref.name, str(wanted.config_map_ref.key), what
        )
    return _material_policy(wanted, origin, pem)
