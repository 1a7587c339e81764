"""The platform's signing trust: named keys and CAs every namespace may require, and where
signatures are mandatory (the chart's `verification.trust` and `verification.requiredIn`).

The chart renders `verification.trust` into one ConfigMap in the release namespace, one key per
entry, `<name>.<method>.pem` (method `publicKey` or `certificate`); the node agent and the hooks
mount it and read it once at start (`load_trust_dir`). A cache asks for an entry with
`spec.verification.signature.<method>.clusterTrust: <name>`. The material is public (public keys,
CA certificates), yet it reaches the PVC-mode downloader without any object in the tenant's
namespace that the tenant could edit: the hooks put it on the Job's Pod template.
`requiredIn` names namespaces ("*": all) where a cache without spec.verification is refused by
the webhook and left InvalidSpec by the sync hook.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from praesto.refs import SpecError
from praesto.verification import BASE, Verification

TRUST_METHODS = ("publicKey", "certificate")
SUFFIX = ".pem"
ALL_NAMESPACES = "*"


@dataclass(frozen=True)
class ClusterTrust:
    method: str  # publicKey or certificate
    pem: bytes = field(repr=False)


def trust_file_name(name: str, method: str) -> str:
    return f"{name}.{method}{SUFFIX}"


def load_trust_dir(directory: str | Path | None) -> dict[str, ClusterTrust]:
    """Every `<name>.<method>.pem` in the mounted ConfigMap (its `..data` links are skipped)."""
    if not directory:
        return {}
    found: dict[str, ClusterTrust] = {}
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(
            f"{root}: the platform trust directory does not exist; mount the chart's trust ConfigMap"
        )
    for path in sorted(root.iterdir()):
        stem, _, method = path.name.removesuffix(SUFFIX).rpartition(".")
        if path.name.startswith(".") or not path.name.endswith(SUFFIX) or method not in TRUST_METHODS:
            continue
        found[stem] = ClusterTrust(method, path.read_bytes())
    return found


@dataclass(frozen=True)
class TrustPolicy:
    trust: Mapping[str, ClusterTrust] = field(default_factory=dict)
    required_in: tuple[str, ...] = ()  # namespaces where a signature is mandatory; "*": every one

    def required(self, namespace: str) -> bool:
        return ALL_NAMESPACES in self.required_in or namespace in self.required_in

    def errors(self, namespace: str, verification: Verification | None) -> list[SpecError]:
        """What the platform's policy refuses in a parsed spec.verification of `namespace`."""
        if verification is None:
            if not self.required(namespace):
                return []
            hint = f"clusterTrust: {next(iter(self.trust))}" if self.trust else "a publicKey or certificate"
            return [
                SpecError(
                    "spec.verification",
                    f"Required value: namespace {namespace} accepts only signed models (the platform's "
                    "verification.requiredIn)",
                    f"add spec.verification.signature naming the signer's trust, e.g. publicKey: {{{hint}}}",
                )
            ]
        name = verification.cluster_trust
        if not name:
            return []
        field_path = f"{BASE}.{verification.method}.clusterTrust"
        entry = self.trust.get(name)
        if entry is None:
            known = ", ".join(sorted(self.trust)) or "none"
            return [
                SpecError(
                    field_path,
                    f"the platform publishes no trust named {name!r} (it has: {known})",
                    "use one of those names, or your own Secret or ConfigMap (secretRef, configMapRef)",
                    name,
                )
            ]
        if entry.method != verification.method:
            return [
                SpecError(
                    field_path,
                    f"the platform's {name!r} is a {entry.method}, not a {verification.method}",
                    f"name it under signature.{entry.method}",
                    name,
                )
            ]
        return []
