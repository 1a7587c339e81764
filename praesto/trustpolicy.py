"""The platform's signing trust: named keys and CAs every namespace may require, and where
signatures are mandatory (the chart's `verification.trust` and `verification.requiredIn`).

The chart renders `verification.trust` into one ConfigMap in the release namespace, one key per
entry, `<name>.<method>.pem` (method `publicKey` or `certificate`); the node agent and the hooks
mount it. The hooks read it at start (`load_trust_dir`; the chart rolls them when it changes); the
node agent is not rolled, so it reads it again whenever the kubelet has updated the volume
(`TrustDir`): a key the platform replaced or withdrew takes every copy verified under it out of
Ready on the next reconcile pass (agent/rolling.py), without a restart. A cache asks for an entry with
`spec.verification.signature.<method>.clusterTrust: <name>`. The material is public (public keys,
CA certificates), yet it reaches the PVC-mode downloader without any object in the tenant's
namespace that the tenant could edit: the hooks put it on the Job's Pod template.
`requiredIn` names namespaces ("*": all) where a cache without spec.verification is refused by
the webhook and left InvalidSpec by the sync hook.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
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


def _stamp(root: Path) -> tuple[tuple[str, int, int, int, int], ...]:
    """What changes when the volume's content does: each entry's inode, size, mtime and ctime (the
    kubelet swaps `..data` to a new timestamped folder, so every file it points at is a new inode;
    a plain folder edited in place changes ctime)."""
    found = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        try:
            seen = entry.stat()  # through the kubelet's symlinks
        except OSError:
            continue
        found.append((entry.name, seen.st_ino, seen.st_size, seen.st_mtime_ns, seen.st_ctime_ns))
    return tuple(found)


class TrustDir(Mapping[str, ClusterTrust]):
    """The mounted trust ConfigMap as it is now: read again on the first look after it changed.

    The kubelet updates a ConfigMap volume in place (within its sync period, about a minute), and
    the agent is not restarted for it, so every look compares a stamp of the folder (one scandir
    and a stat per entry) and reads the files again when it moved. A folder that cannot be read
    any more keeps the last trust read: a missing volume is the start's error (`load_trust_dir`),
    never a reason to drop every copy at once.
    """

    def __init__(self, directory: str | Path) -> None:
        self.root = Path(directory)
        self._lock = threading.Lock()
        self._stamp = _stamp(self.root) if self.root.is_dir() else ()
        self._entries = load_trust_dir(self.root)  # ValueError when the folder is missing

    def current(self) -> dict[str, ClusterTrust]:
        with self._lock:
            try:
                stamp = _stamp(self.root)
                if stamp != self._stamp:
                    self._entries, self._stamp = load_trust_dir(self.root), stamp
            except (OSError, ValueError):
                pass  # the last trust read stays (see the class docstring)
            return self._entries

    def __getitem__(self, name: str) -> ClusterTrust:
        return self.current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.current())

    def __len__(self) -> int:
        return len(self.current())


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
