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

from collections.abc import Mapping
from dataclasses import dataclass, field

from praesto.agent.copies import CacheRef
from praesto.agent.download.api import SignaturePolicy
from praesto.agent.download.objcreds import settings_from_secret
from praesto.agent.kube import KubeApi, SecretUnavailable

from praesto import credscope, names, store, trustpolicy
from praesto.verification import BASE as VERIFICATION_FIELD
from praesto.verification import Verification

CLUSTER_SECRET_ENV = "PRAESTO_CREDENTIALS_SECRET"  # noqa: S105 - chart credentials.secretRef: "namespace/name"
# chart credentials.namespaces, comma-separated: who may use the cluster's credentials at all
CLUSTER_CREDENTIALS_NAMESPACES_ENV = credscope.ENV_NAMESPACES
# chart credentials.sources, comma-separated URI prefixes: what the cluster's credentials may fetch
CLUSTER_CREDENTIALS_SOURCES_ENV = credscope.ENV_SOURCES

# (HF token, object-store settings, where they came from for messages)
Credentials = tuple[str | None, dict[str, str] | None, str]


@dataclass(frozen=True)
class CredentialPolicy:
    scope: credscope.CredentialScope = field(default_factory=credscope.CredentialScope)
    cluster_secret: tuple[str, str] | None = None  # (namespace, name) of the chart's Secret
    # the platform's signing trust by name (chart verification.trust, praesto/trustpolicy.py)
    cluster_trust: Mapping[str, trustpolicy.ClusterTrust] = field(default_factory=dict)

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

    def credentials(self, kube: KubeApi, ref: CacheRef) -> Credentials:
        """(HF token, object-store settings, where from) for one attempt (Secrets read now)."""
        source, secret_ref = ref.source, ref.source.secret_ref
        if secret_ref is not None and source.scheme == "hf":
            return kube.read_token(ref.namespace, secret_ref.name, secret_ref.key), None, ""
        if secret_ref is not None and source.scheme == "oci":  # a kubernetes.io/dockerconfigjson Secret
            key = secret_ref.key or names.DOCKER_CONFIG_KEY
            what = "a Docker config JSON (kubectl create secret docker-registry)"
            login = kube.read_secret_value(ref.namespace, secret_ref.name, key, what).decode()
            return None, {names.DOCKER_CONFIG_KEY: login}, f"Secret {ref.namespace}/{secret_ref.name}"
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
        data, annotations = kube.read_secret(namespace, name)
        where = f"Secret {namespace}/{name}"
        if source.scheme == "oci":  # the cluster's Secret may hold a registry login too
            shared = data.get(names.DOCKER_CONFIG_KEY)
            return None, ({names.DOCKER_CONFIG_KEY: shared} if shared else None), where
        settings = settings_from_secret(data, annotations)
        if source.scheme == "hf":
            return settings.get("HF_TOKEN") or None, None, where
        return None, settings, where


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


def required_signature(
    ref: CacheRef, cluster_trust: Mapping[str, trustpolicy.ClusterTrust]
) -> store.RequiredSignature | None:
    """What a copy of `ref` must have been verified with, as far as the agent knows it without the
    API: the platform's trust (re-read when its volume changed) and a sigstore identity give the
    fingerprint; a namespace Secret or ConfigMap is read only by a download (the per-cache grant
    exists only while a copy downloads: hooks/local.py), so there only method and path are known.
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
    if wanted.secret_ref is not None:
        name, key = wanted.secret_ref.name, str(wanted.secret_ref.key)
        pem = kube.read_secret_value(ref.namespace, name, key, what)
        origin = f"Secret {ref.namespace}/{name} key {key}"
    elif wanted.config_map_ref is not None:
        name, key = wanted.config_map_ref.name, str(wanted.config_map_ref.key)
        pem = kube.read_config_map_value(ref.namespace, name, key, what)
        origin = f"ConfigMap {ref.namespace}/{name} key {key}"
    else:
        raise SecretUnavailable(f"{VERIFICATION_FIELD}.{wanted.method} names no Secret or ConfigMap")
    origin += f" ({VERIFICATION_FIELD}.{wanted.method})"
    if wanted.method == "publicKey":
        return SignaturePolicy(wanted.method, wanted.path, origin, public_key=pem)
    return SignaturePolicy(wanted.method, wanted.path, origin, certificates=(pem,))
