"""What a ModelCache author may not ask of the PVC-mode download Job's container.

The Job runs in the author's namespace under the Praesto chart's name; a spec that
makes it privileged, root, able to gain privileges, or holding added
capabilities would let anyone who can create a ModelCache run such a container
(multi-tenant finding 4). The spec parser refuses these fields, so the
validating webhook and the sync hook (which then emits no Job) refuse the same
things. Tightening (dropping capabilities, a read-only root, a non-root uid) is
always allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FIELD = "spec.downloader.containerSecurityContext"
FIX = "remove it: the download needs no privileges (the chart's Job runs as uid 65532 with nothing added)"


def privilege_errors(context: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(field, cause, fix) for each privilege-raising setting in a container securityContext."""
    found: list[tuple[str, str, str]] = []

    def refuse(key: str, cause: str) -> None:
        found.append((f"{FIELD}.{key}", cause, FIX))

    if context.get("privileged") is True:
        refuse("privileged", "a privileged container may not be requested")
    if context.get("allowPrivilegeEscalation") is True:
        refuse("allowPrivilegeEscalation", "privilege escalation may not be allowed")
    if context.get("runAsUser") == 0:
        refuse("runAsUser", "the container may not run as root (uid 0)")
    if context.get("runAsGroup") == 0:
        refuse("runAsGroup", "the container may not run with the root group (gid 0)")
    if context.get("runAsNonRoot") is False:
        refuse("runAsNonRoot", "runAsNonRoot may not be turned off")
    capabilities = context.get("capabilities")
    if isinstance(capabilities, Mapping) and capabilities.get("add"):
        refuse("capabilities.add", f"capabilities may not be added ({capabilities['add']!r})")
    if context.get("procMount") not in (None, "Default"):
        refuse("procMount", "only the Default proc mount is allowed")
    if "seLinuxOptions" in context:
        refuse("seLinuxOptions", "SELinux options may not be set (a type such as spc_t escapes confinement)")
    for key in ("seccompProfile", "appArmorProfile"):
        profile = context.get(key)
        if isinstance(profile, Mapping) and profile.get("type") == "Unconfined":
            refuse(f"{key}.type", "an Unconfined profile may not be requested")
    windows = context.get("windowsOptions")
    if isinstance(windows, Mapping) and windows.get("hostProcess") is True:
        refuse("windowsOptions.hostProcess", "a host process container may not be requested")
    return found
