"""What a ModelCache author may ask of the PVC-mode download Job's container: only what keeps it restricted.

The Job runs in the author's namespace under the Praesto chart's name; a spec that
makes it privileged, root, able to gain privileges, or holding added
capabilities would let anyone who can create a ModelCache run such a container
(multi-tenant finding 4). The override is merged over the chart's restricted
context, so a field set to null, an empty `capabilities.drop` or a `Localhost`
seccomp profile undoes the baseline as surely as `privileged: true` (issue 21
item 18). So this is an allow-list: each field may only take values that keep the
Pod Security "restricted" profile (k8s.io/pod-security-admission policy, v0.37.2:
allowPrivilegeEscalation false, capabilities dropping ALL and adding none,
runAsNonRoot, a non-zero uid, the RuntimeDefault seccomp profile) and no weaker
than the chart's own. The spec parser refuses anything else, so the validating
webhook and the sync hook (which then emits no Job) refuse the same things; the
Job builder checks again before merging.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

FIELD = "spec.downloader.containerSecurityContext"
FIX = "remove it, or set a value that keeps the container restricted (the chart's Job runs as uid 65532 with nothing added)"


def _is(value: Any) -> Callable[[Any], bool]:
    return lambda given: given is value


def _positive_int(given: Any) -> bool:
    return isinstance(given, int) and not isinstance(given, bool) and given > 0


def _runtime_default(given: Any) -> bool:
    return isinstance(given, Mapping) and dict(given) == {"type": "RuntimeDefault"}


def _drops_all(given: Any) -> bool:
    if not isinstance(given, Mapping) or set(given) != {"drop"}:
        return False
    drop = given["drop"]
    return isinstance(drop, list) and all(isinstance(c, str) for c in drop) and "ALL" in drop


# field -> (accepted, what is accepted). A field not listed here may not be set at all.
ALLOWED: Mapping[str, tuple[Callable[[Any], bool], str]] = {
    "allowPrivilegeEscalation": (_is(False), "may only be false"),
    "privileged": (_is(False), "may only be false"),
    "runAsNonRoot": (_is(True), "may only be true"),
    "readOnlyRootFilesystem": (lambda given: isinstance(given, bool), "must be true or false"),
    "runAsUser": (_positive_int, "must be a uid above 0 (not root)"),
    "runAsGroup": (_positive_int, "must be a gid above 0 (not the root group)"),
    "procMount": (lambda given: given == "Default", "may only be Default"),
    "capabilities": (_drops_all, 'may only drop capabilities, and the list must include "ALL" (none added)'),
    "seccompProfile": (
        _runtime_default,
        "may only be {type: RuntimeDefault} (a Localhost profile may be any profile on the node)",
    ),
    "appArmorProfile": (_runtime_default, "may only be {type: RuntimeDefault}"),
}
NEVER = {
    "seLinuxOptions": "SELinux options may not be set (a type such as spc_t escapes confinement)",
    "windowsOptions": "Windows options may not be set (the downloader is a Linux container)",
}


def privilege_errors(context: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(field, cause, fix) for each setting that would leave the Pod Security "restricted" profile.

    Unknown fields are the caller's to report (hooks/modelcache.py downloader_errors names them).
    """
    found: list[tuple[str, str, str]] = []
    for key, value in context.items():
        if key in NEVER:
            found.append((f"{FIELD}.{key}", NEVER[key], FIX))
            continue
        rule = ALLOWED.get(key)
        if rule is None:
            continue
        accepted, wanted = rule
        if not accepted(value):
            shown = "null" if value is None else repr(value)[:120]
            found.append((f"{FIELD}.{key}", f"{wanted}; got {shown}", FIX))
    return found
