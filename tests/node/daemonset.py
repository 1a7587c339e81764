"""The chart's node DaemonSet, run as host processes on the node tier's real node.

The agent and the CSI plugin run from the installed wheel (the bytes a user gets), with
the command, arguments and environment the chart renders for their containers. Only
what a container would see differently from a host process is translated: downward-API
variables (`$(NODE_NAME)`, `$(POD_IP)`) are expanded as the kubelet does, and a path
inside a container is mapped through its volumeMounts to the hostPath behind it (or to the
tier's copy of a mounted ConfigMap), and the chart's host paths (kubelet dir, store) to the
tier's own folders.

The agent's identity is the chart's: a ServiceAccount token bound to the Pod the
DaemonSet would run on this node. The real kubelet runs that Pod; its containers are
the tier's placeholder (the processes themselves run on the host), so the token carries
the node name claim the chart's ValidatingAdmissionPolicies check.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.node_images import BUSYBOX_IMAGE

Obj = dict[str, Any]
VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True)
class HostPaths:
    """Where the chart's host paths are on this machine."""

    kubelet_dir: str  # chart csi.kubeletDir
    tier_kubelet_dir: Path
    base_path: str  # chart localCache.basePath
    tier_base_path: Path
    config_maps: dict[str, Path]  # a mounted ConfigMap -> its copy, as the kubelet would mount it

    def host(self, path: str) -> str:
        for chart, tier in ((self.kubelet_dir, self.tier_kubelet_dir), (self.base_path, self.tier_base_path)):
            if path == chart or path.startswith(chart.rstrip("/") + "/"):
                return str(tier) + path[len(chart.rstrip("/")) :]
        return path


def container(daemonset: Obj, name: str) -> Obj:
    (found,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return dict(found)


def host_path_of(daemonset: Obj, spec: Obj, path: str, paths: HostPaths) -> str:
    """A path as the container sees it, as the host sees it (through the longest matching mount)."""
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"].get("volumes") or []}
    mounts = sorted(spec.get("volumeMounts") or [], key=lambda m: len(m["mountPath"]), reverse=True)
    for mount in mounts:
        at = mount["mountPath"].rstrip("/")
        if path == at or path.startswith(at + "/"):
            volume = volumes.get(mount["name"]) or {}
            if "hostPath" in volume:
                return paths.host(volume["hostPath"]["path"].rstrip("/") + path[len(at) :])
            config_map = (volume.get("configMap") or {}).get("name")
            if config_map in paths.config_maps:
                return str(paths.config_maps[config_map]) + path[len(at) :]
    return paths.host(path)


def expand(value: str, env: dict[str, str]) -> str:
    """`$(VAR)` the way the kubelet expands it in args; an unknown variable stays as written."""
    return VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def rendered_env(spec: Obj, downward: dict[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in spec.get("env") or []:
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
        else:
            field = (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath", "")
            if field in downward:
                env[item["name"]] = downward[field]
    return env


def host_argv(
    daemonset: Obj, name: str, script: str, downward: dict[str, str], paths: HostPaths
) -> list[str]:
    """The container's command line as a host process: the wheel's script, args translated."""
    spec = container(daemonset, name)
    env = rendered_env(spec, downward)
    argv = [script]
    for arg in spec.get("args") or []:
        text = expand(str(arg), env)
        flag, eq, value = text.partition("=")
        if eq and value.startswith("unix://"):
            text = f"{flag}=unix://{host_path_of(daemonset, spec, value.removeprefix('unix://'), paths)}"
        elif eq and value.startswith("/"):
            text = f"{flag}={host_path_of(daemonset, spec, value, paths)}"
        argv.append(text)
    return argv


def placeholder_pod(daemonset: Obj, node: str) -> Obj:
    """The Pod the DaemonSet would run on `node`, its containers the tier's placeholder."""
    template = copy.deepcopy(daemonset["spec"]["template"])
    spec = template["spec"]
    spec["nodeName"] = node
    spec["volumes"] = []
    spec["containers"] = [
        {
            "name": "host-processes",
            "image": BUSYBOX_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["sleep", "1000000"],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{daemonset['metadata']['name']}-{node}",
            "namespace": daemonset["metadata"]["namespace"],
            "labels": template["metadata"].get("labels", {}),
        },
        "spec": spec,
    }
