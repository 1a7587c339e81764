"""`spec.verification`: the signature a cache's model must carry, and where its trust material is.

    verification:
      signature:
        path: model.sig                      # optional; the model-signing library's default
        publicKey:   {secretRef | configMapRef: {name, key} | clusterTrust: NAME}  # a PEM public key (EC P-256/384/521)
        certificate: {secretRef | configMapRef: {name, key} | clusterTrust: NAME}  # PEM CA certificates
        sigstore:    {identity, oidcIssuer}    # keyless: needs Sigstore's public services

Exactly one of publicKey, certificate and sigstore; the material in exactly one Secret or ConfigMap
of the cache's namespace, or the platform's own, named in the chart's `verification.trust`
(`clusterTrust`: public keys and CA certificates the platform team publishes for every namespace;
praesto/trustpolicy.py). Namespace material reaches the node agent the way the source's token Secret does: a Role
on that one object that the sync hook returns only while a copy needs it (hooks/local.py). The node agent verifies the
bundle before it publishes (agent/download/signature.py); what a ModelCacheNode carries is
`Verification.to_node_dict()`, names only, never the material.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from praesto import names
from praesto.refs import SECRET_KEY, SecretRef, SpecError, check_secret_name

BASE = "spec.verification.signature"
METHODS = ("publicKey", "certificate", "sigstore")  # agent/download/api.py SIGNATURE_METHODS: the same
_PEM_HINT = {
    "publicKey": "the PEM public key (e.g. kubectl create configmap NAME --from-file=key.pub)",
    "certificate": "the PEM CA certificates (e.g. kubectl create configmap NAME --from-file=ca.pem)",
}


@dataclass(frozen=True)
class Verification:
    method: str  # one of METHODS
    path: str = names.DEFAULT_SIGNATURE_FILE
    secret_ref: SecretRef | None = None  # publicKey, certificate: the Secret holding the PEM, or
    config_map_ref: SecretRef | None = None  # the ConfigMap holding it (same {name, key} shape)
    identity: str = ""  # sigstore
    oidc_issuer: str = ""  # sigstore
    cluster_trust: str = ""  # publicKey, certificate: a name in the chart's verification.trust

    def to_node_dict(self) -> dict[str, Any]:
        """The form a ModelCacheNode's spec.verification carries (names, never material)."""
        out: dict[str, Any] = {"method": self.method, "path": self.path}
        if self.secret_ref is not None:
            out["secretRef"] = {"name": self.secret_ref.name, "key": self.secret_ref.key}
        if self.config_map_ref is not None:
            out["configMapRef"] = {"name": self.config_map_ref.name, "key": self.config_map_ref.key}
        if self.identity:
            out["identity"], out["oidcIssuer"] = self.identity, self.oidc_issuer
        if self.cluster_trust:
            out["clusterTrust"] = self.cluster_trust
        return out


def verification_from_node_spec(value: Any) -> Verification | None:
    """What the sync hook wrote with `to_node_dict` (None: no signature required)."""
    if not isinstance(value, dict) or value.get("method") not in METHODS:
        return None
    refs = [value.get(k) for k in ("secretRef", "configMapRef")]
    secret, config_map = (
        SecretRef(str(r["name"]), str(r["key"])) if isinstance(r, dict) else None for r in refs
    )
    return Verification(
        str(value["method"]),
        str(value.get("path") or names.DEFAULT_SIGNATURE_FILE),
        secret,
        config_map,
        str(value.get("identity") or ""),
        str(value.get("oidcIssuer") or ""),
        str(value.get("clusterTrust") or ""),
    )


def _check_path(path: Any, errors: list[SpecError]) -> str:
    if path is None:
        return names.DEFAULT_SIGNATURE_FILE
    parts = path.split("/") if isinstance(path, str) else [""]
    if (
        not isinstance(path, str)
        or not path
        or len(path) > 1024
        or path.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
        or parts[0].startswith(".praesto")
    ):
        errors.append(
            SpecError(
                f"{BASE}.path",
                "must be a relative path inside the model, without '..'",
                f"e.g. {names.DEFAULT_SIGNATURE_FILE} (the default)",
                path,
            )
        )
    return str(path)


TRUST_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a key of the chart's verification.trust


def _trust_ref(method: str, value: Any, errors: list[SpecError]) -> tuple[str, SecretRef] | None:
    """("secretRef" | "configMapRef", {name, key}) or ("clusterTrust", {name}) of a publicKey or
    certificate method."""
    base = f"{BASE}.{method}"
    kinds = ("secretRef", "configMapRef", "clusterTrust")
    given = [k for k in kinds if isinstance(value, dict) and value.get(k) is not None]
    if len(given) != 1:
        errors.append(
            SpecError(
                base,
                "set exactly one of secretRef, configMapRef and clusterTrust"
                if given
                else "Required value: secretRef, configMapRef or clusterTrust",
                f"name a Secret or ConfigMap in the cache's namespace and the key that holds {_PEM_HINT[method]}, "
                "or the platform's trust by its name in the chart's verification.trust",
            )
        )
        return None
    kind, ref = given[0], value[given[0]]
    if kind == "clusterTrust":
        if not isinstance(ref, str) or not TRUST_NAME.match(ref):
            errors.append(
                SpecError(f"{base}.clusterTrust", "is not a trust name", "e.g. platform-models", ref)
            )
            return None
        return kind, SecretRef(ref)
    field = f"{base}.{kind}"
    if not isinstance(ref, dict) or not ref.get("name") or not ref.get("key"):
        errors.append(
            SpecError(
                field,
                f"Required value: {kind}.name and {kind}.key",
                f"name the object and the key that holds {_PEM_HINT[method]}",
            )
        )
        return None
    found = check_secret_name(ref["name"], f"{field}.name", "Secret" if kind == "secretRef" else "ConfigMap")
    if not isinstance(ref["key"], str) or not SECRET_KEY.match(ref["key"]):
        found.append(SpecError(f"{field}.key", "is not a valid key", "e.g. key.pub", ref["key"]))
    errors.extend(found)
    return None if found else (kind, SecretRef(ref["name"], ref["key"]))


def parse_verification(value: Any, errors: list[SpecError]) -> Verification | None:
    """`spec.verification`, checked; None when absent. Problems go to `errors`."""
    if value is None:
        return None
    signature = value.get("signature") if isinstance(value, dict) else None
    if not isinstance(signature, dict):
        errors.append(
            SpecError(
                BASE, "Required value", "set verification.signature.publicKey, .certificate or .sigstore"
            )
        )
        return None
    given = [m for m in METHODS if signature.get(m) is not None]
    if len(given) != 1:
        cause = "no trust method is set" if not given else f"{' and '.join(given)} are all set"
        errors.append(
            SpecError(BASE, cause, "set exactly one of signature.publicKey, .certificate or .sigstore")
        )
        return None
    method = given[0]
    path = _check_path(signature.get("path"), errors)
    if method == "sigstore":
        sigstore = signature["sigstore"]
        identity = sigstore.get("identity") if isinstance(sigstore, dict) else None
        issuer = sigstore.get("oidcIssuer") if isinstance(sigstore, dict) else None
        if not isinstance(identity, str) or not identity or not isinstance(issuer, str) or not issuer:
            errors.append(
                SpecError(
                    f"{BASE}.sigstore",
                    "identity and oidcIssuer are both required",
                    "e.g. identity: publisher@example.com, oidcIssuer: https://accounts.google.com",
                )
            )
            return None
        return Verification(method, path, identity=identity, oidc_issuer=issuer)
    found = _trust_ref(method, signature[method], errors)
    if found is None:
        return None
    kind, ref = found
    if kind == "clusterTrust":
        return Verification(method, path, cluster_trust=ref.name)
    if kind == "secretRef":
        return Verification(method, path, secret_ref=ref)
    return Verification(method, path, config_map_ref=ref)
