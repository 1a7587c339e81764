"""What a real node leaves on the machine, and taking it away again.

The kubelet and containerd keep some state at fixed host paths whatever they are told:
shim sockets in `/run/containerd`, network namespaces in `/run/netns`, CNI result
caches in `/var/lib/cni`, `/var/lib/kubelet/device-plugins`, `/var/log/containers`,
cgroups `/kubepods` in every v1 hierarchy, iptables canary chains, a bridge. So the node
tier is one per machine, and its teardown removes everything it made and then checks,
against a snapshot taken before the node started, that nothing is left: no mount, cgroup,
interface, iptables chain, process, path or changed host setting (ip_forward).

The node's own address is NODE_IP in TEST-NET-1 (192.0.2.0/24, a documentation range),
on a veth pair the tier creates: the kubelet refuses a loopback node IP, and the machine's
external address is never used. Nothing is sent anywhere but to this address.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

NODE_IP = "192.0.2.10"
NODE_LINK = "praesto-node0"
NODE_LINK_PEER = "praesto-node1"
FIXED_PATHS = (
    Path("/run/containerd"),
    Path("/run/netns"),
    Path("/var/lib/cni"),
    Path("/var/lib/kubelet"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/etc/cni"),
    Path("/opt/cni"),
    Path("/usr/libexec/kubernetes"),
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Host settings the node changes: the CNI bridge plugin turns on forwarding for its gateway.
SYSCTLS = (Path("/proc/sys/net/ipv4/ip_forward"),)
NODE_PROCESSES = ("kubelet", "containerd", "containerd-shim-runc-v2", "pause")
COMM_LENGTH = 15  # /proc/<pid>/comm holds the first 15 bytes of a name (TASK_COMM_LEN - 1)
MNT_DETACH = 2


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def mount_points() -> list[str]:
    """Every mount point, in mount order (the fifth field of /proc/self/mountinfo)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4].replace("\\040", " ") for line in lines]


def links() -> set[str]:
    return {
        line.split(":")[1].strip().split("@")[0] for line in _run("ip", "-o", "link", "show").splitlines()
    }


def iptables_chains() -> set[str]:
    """User-defined chains as `tool/table/chain`, and rules as `tool/table/-A ...`.

    Built-in chains are left out: they appear in iptables-save as soon as anything
    loads their table, whether or not anything is in them.
    """
    found: set[str] = set()
    for tool in ("iptables-save", "ip6tables-save"):
        table = ""
        for line in _run(tool).splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and line.split()[1] == "-":
                found.add(f"{tool}/{table}/{line[1:].split()[0]}")
            elif line.startswith("-A "):
                found.add(f"{tool}/{table}/{line}")
    return found


def kubepods_cgroups() -> set[str]:
    found: set[str] = set()
    if CGROUP_ROOT.is_dir():
        for hierarchy in CGROUP_ROOT.iterdir():
            kubepods = hierarchy / "kubepods"
            if kubepods.is_dir():
                found |= {str(p) for p in (kubepods, *kubepods.rglob("*")) if p.is_dir()}
    return found


def node_processes() -> set[str]:
    found: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if comm in {name[:COMM_LENGTH] for name in NODE_PROCESSES}:
            found.add(f"{proc.name}:{comm}")
    return found


def sysctls() -> set[str]:
    """`path=value` of each watched host setting."""
    return {f"{p}={p.read_text().strip()}" for p in SYSCTLS if p.exists()}


def restore_sysctls(before: set[str]) -> None:
    for entry in before:
        path, value = entry.split("=", 1)
        with contextlib.suppress(OSError):
            Path(path).write_text(value)


@dataclass(frozen=True)
class Footprint:
    """What of the node's kinds of state exists at one moment."""

    mounts: frozenset[str]
    links: frozenset[str]
    chains: frozenset[str]
    cgroups: frozenset[str]
    processes: frozenset[str]
    paths: frozenset[str]
    settings: frozenset[str]

    @classmethod
    def now(cls, workdir: Path) -> Footprint:
        under = str(workdir)
        watched = (under, *(str(p) for p in FIXED_PATHS))
        return cls(
            mounts=frozenset(m for m in mount_points() if m.startswith(watched)),
            links=frozenset(links()),
            chains=frozenset(iptables_chains()),
            cgroups=frozenset(kubepods_cgroups()),
            processes=frozenset(node_processes()),
            paths=frozenset(str(p) for p in FIXED_PATHS if p.exists()),
            settings=frozenset(sysctls()),
        )

    def added_since(self, before: Footprint) -> dict[str, list[str]]:
        """What exists now that did not before, by kind (empty when the node left nothing)."""
        kinds = ("mounts", "links", "chains", "cgroups", "processes", "paths", "settings")
        added = {kind: sorted(getattr(self, kind) - getattr(before, kind)) for kind in kinds}
        return {kind: items for kind, items in added.items() if items}


def add_node_address() -> None:
    """A veth pair holding NODE_IP, so the kubelet has an address of its own that is not loopback."""
    remove_link(NODE_LINK)
    subprocess.run(
        ["ip", "link", "add", NODE_LINK, "type", "veth", "peer", "name", NODE_LINK_PEER], check=True
    )
    subprocess.run(["ip", "addr", "add", f"{NODE_IP}/32", "dev", NODE_LINK], check=True)
    for name in (NODE_LINK, NODE_LINK_PEER):
        subprocess.run(["ip", "link", "set", name, "up"], check=True)


def remove_link(name: str) -> None:
    if name in links():
        subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


def unmount_under(prefixes: tuple[str, ...]) -> None:
    """Detach every mount at or below `prefixes`, deepest (latest) first."""
    libc = ctypes.CDLL(None, use_errno=True)
    for point in reversed(mount_points()):
        if point.startswith(prefixes):
            libc.umount2(point.encode(), MNT_DETACH)


def kill_processes(comms: tuple[str, ...], marker: str, deadline: float = 10.0) -> None:
    """SIGKILL processes named `comms` whose command line mentions `marker` (our shims, not
    others), and wait until they are gone (or `deadline` passes: the leftover check reports it)."""
    killed: list[Path] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm = (proc / "comm").read_text().strip()
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if comm in {name[:COMM_LENGTH] for name in comms} and marker in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(proc)
    end = time.monotonic() + deadline
    while any(p.exists() for p in killed) and time.monotonic() < end:
        time.sleep(0.1)  # poll interval, bounded by the deadline above


def kill_cgroup_processes(cgroups: set[str]) -> None:
    for cgroup in cgroups:
        procs = Path(cgroup) / "cgroup.procs"
        try:
            pids = procs.read_text().split()
        except OSError:
            continue
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def remove_cgroups(cgroups: set[str], deadline: float = 10.0) -> None:
    """rmdir the cgroups (deepest first), killing what is still in them, until they are gone or
    `deadline` passes: a killed process leaves its cgroup only once it has exited, so the first
    rmdir after a kill can fail. A cgroup that stays is reported by the leftover check."""
    end = time.monotonic() + deadline
    left = set(cgroups)
    while left:
        kill_cgroup_processes(left)
        for cgroup in sorted(left, key=lambda c: c.count("/"), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(cgroup)
        left = {c for c in left if os.path.isdir(c)}
        if not left or time.monotonic() > end:
            return
        time.sleep(0.1)  # poll interval, bounded by the deadline above


def remove_chains(entries: set[str]) -> None:
    """Delete leftover rules, then flush and delete leftover chains (entries of `iptables_chains`)."""
    parsed = [entry.split("/", 2) for entry in sorted(entries)]
    for tool, table, item in parsed:
        if item.startswith("-A "):
            binary = tool.removesuffix("-save")
            subprocess.run([binary, "-t", table, "-D", *item.split()[1:]], capture_output=True, check=False)
    for tool, table, item in parsed:
        if not item.startswith("-A "):
            binary = tool.removesuffix("-save")
            subprocess.run([binary, "-t", table, "-F", item], capture_output=True, check=False)
            subprocess.run([binary, "-t", table, "-X", item], capture_output=True, check=False)
