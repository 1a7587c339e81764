"""`helm upgrade` during a download: the node's agent is replaced mid-download, resumes, and running Pods keep reading.

Issue 36 item 2: "an agent replaced in the middle of a download resumes it". With the real helm
v4.3.2 CLI against the tier's API server and a real kubelet + containerd:

* `helm install` of the working tree's chart (as tests/node/test_helm_lifecycle.py does, with its
  stand-ins: Metacontroller's part played by testkit/metacontroller.py, the node DaemonSet's agent
  and CSI plugin run as host processes from the installed wheel, tests/node/node_daemons.py), with
  `nodeAgent.concurrency=2`, so that the parts in flight are few beside the file;
* a first ModelCache Ready and a Pod hashing its /models files every half second;
* a second ModelCache of a 128 MiB file the hub serves at 3 MiB/s per response (a CDN's
  per-connection cap), so the download is under way: its status shows bytes done, well below the
  total;
* `helm upgrade --reuse-values --set nodeAgent.logLevel=debug`, which changes the node DaemonSet's
  Pod template (chart README, "Upgrades: what rolls") and nothing the hooks read; then this node's
  Pod is replaced as the DaemonSet controller does it (RollingUpdate, maxSurge 0): the old Pod is
  deleted and its processes stopped (SIGTERM), then a Pod of the new template starts, its agent
  with the new template's environment;
* the second cache Ready, the hub having served its file no more than once plus the parts that
  were in flight when the old agent stopped (part size x the agent's --concurrency): the new agent
  resumed from the journal in the store's staging (agent/download/journal.py) instead of starting
  over; the first Pod's container never restarted, its mount stayed, and every read, while the node
  had no agent or CSI plugin and after, gave the same bytes.

A helm-installing module: conftest runs it before the session installs the chart without helm.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from praesto.agent.download.api import Options

from praesto import names
from testkit.chart_install import METACONTROLLER_CRDS, install_crds
from testkit.controlplane import ControlPlane, wait_for
from testkit.helm_chart import NAMESPACE, RELEASE, one
from testkit.hub import LocalHub
from testkit.kube_apply import Kube
from testkit.metacontroller import Metacontroller
from testkit.metacontroller_subchart import chart_copy_with_dependency
from testkit.praesto_image import praesto_image
from testkit.real_node import RealNode
from tests.cluster.controllers import WATCH_LAG
from tests.cluster.tenants import modelcache, opted_in_namespace
from tests.node.helm_release import HelmCli, ReleaseOnNode, ServiceHookClient, still_there, wait_rolled_out
from tests.node.node_daemons import NodeDaemons
from tests.node.pods import busybox_pod, core, delete_pod, mount_points_of, pod_log
from tests.node.test_helm_lifecycle import HOOKS, MODEL, install_line, leave_no_release, tier_values

Obj = dict[str, Any]
TENANT = "upgrade-tenant"
SERVED, SERVED_REPO = "served", "upgrade-demo/served"  # Ready before the upgrade, read throughout
LARGE, LARGE_REPO = "large", "upgrade-demo/large"  # downloading while the agent is replaced
LARGE_FILE = "large-weights.safetensors"  # a name no other repo of the session's hub serves
LARGE_SIZE = 128 << 20
RATE = 3 << 20  # bytes/s per response: the file takes ~21 s over the agent's two connections
CONCURRENCY = 2  # nodeAgent.concurrency: parts in flight at once
PART = Options.part_size  # the agent's byte ranges, also what a resume trusts (no flag sets it)
IN_FLIGHT = PART * CONCURRENCY
DIGESTS = {f"/models/{path}": hashlib.sha256(data).hexdigest() for path, data in MODEL.items()}
READER = "while true; do sha256sum " + " ".join(sorted(DIGESTS)) + "; sleep 0.5; done"
DEADLINE = 180.0


def standin_for(release: ReleaseOnNode, plane: ControlPlane, workdir: Path) -> Metacontroller:
    """The Metacontroller stand-in with the controllers the release installed, calling the hooks
    through their Service (as test_helm_lifecycle.py)."""
    composite = one(release.objects, "CompositeController")
    ca = workdir / "hooks-ca.crt"
    ca.write_text(composite["spec"]["hooks"]["sync"]["webhook"]["caBundle"]["inline"])
    hooks = ServiceHookClient("", ca, kube=release.admin)
    return Metacontroller(Kube(plane.admin(), field_manager="metacontroller"), hooks, composite,
                          one(release.objects, "DecoratorController"), lag=WATCH_LAG)  # fmt: skip


def cache_status(admin: Kube, name: str) -> Obj:
    got = admin.get(names.API_VERSION, names.MODELCACHE_KIND, name, TENANT) or {}
    return dict(got.get("status") or {})


def reads(admin: Kube) -> list[str]:
    """The reader's log lines: each `<sha256>  /models/<file>` of one read."""
    return pod_log(admin, "reader", TENANT).splitlines()


def wrong_reads(lines: list[str]) -> list[str]:
    """Lines that are not a read of a /models file giving the bytes it was published with."""
    return [line for line in lines if DIGESTS.get(line.partition("  ")[2]) != line.partition("  ")[0]]


def wait_new_reads(admin: Kube, after: int, what: str) -> int:
    """Until the reader logged another full round of reads past line `after`; the lines now."""
    wait_for(f"the reader reading /models {what}", lambda: len(reads(admin)) >= after + 2 * len(DIGESTS), 30)
    lines = reads(admin)
    assert wrong_reads(lines) == [], f"reads {what} gave other bytes"
    return len(lines)


def reader_container(admin: Kube) -> tuple[str, str, int]:
    """The reader's Pod uid, container id and restart count."""
    pod = core(admin).read_namespaced_pod("reader", TENANT)
    (status,) = pod.status.container_statuses
    return pod.metadata.uid, status.container_id, status.restart_count


def process_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def agent_env(daemonset: Obj) -> dict[str, str]:
    (agent,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    return {e["name"]: e["value"] for e in agent.get("env") or [] if "value" in e}


def generation(admin: Kube, kind: str, name: str) -> int:
    got = admin.get("apps/v1", kind, name, NAMESPACE)
    assert got is not None, f"{kind} {NAMESPACE}/{name}"
    return int(got["metadata"]["generation"])


def agent_records(log: Path, offset: int) -> list[Obj]:
    """The agent's JSON log records written after byte `offset` of its log."""
    with log.open("rb") as handle:
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


@pytest.mark.timeout(900)
def test_an_upgrade_mid_download_resumes_it_and_running_pods_keep_reading(
    control_plane: ControlPlane, node: RealNode, hub: LocalHub, tmp_path: Path
) -> None:
    admin = Kube(control_plane.admin())
    install_crds(admin, [METACONTROLLER_CRDS])  # the cluster's own Metacontroller brought them
    node.containerd.import_image(praesto_image().archive)
    hub.add_repo(SERVED_REPO, MODEL)
    hub.add_repo(LARGE_REPO, {"config.json": b'{"hidden_size": 4096}', LARGE_FILE: os.urandom(LARGE_SIZE)})
    helm = HelmCli(tmp_path, control_plane.admin_kubeconfig)
    chart_copy_with_dependency(helm.cwd / "charts")
    values = tier_values(hub)
    values["nodeAgent"]["concurrency"] = CONCURRENCY
    (helm.cwd / "tier-values.yaml").write_text(yaml.safe_dump(values))
    helm.run(install_line())
    wait_rolled_out(admin, HOOKS, NAMESPACE, DEADLINE)
    release = ReleaseOnNode(control_plane, admin, tmp_path / "trust", helm.manifest(RELEASE, NAMESPACE))
    release.trust_dir.mkdir()
    with (
        standin_for(release, control_plane, tmp_path),
        NodeDaemons(release, node, tmp_path / "daemons") as daemons,
    ):
        try:
            upgrade_mid_download(helm, admin, node, hub, release, daemons)
            uninstall(helm, admin)
        finally:
            hub.faults.rate = 0  # the session's hub serves later modules
            leave_no_release(helm)


def upgrade_mid_download(
    helm: HelmCli, admin: Kube, node: RealNode, hub: LocalHub, release: ReleaseOnNode, daemons: NodeDaemons
) -> None:
    on_node = {"kubernetes.io/hostname": node.name}
    # ---- a cache Ready, and a Pod reading it that runs through the upgrade ----
    opted_in_namespace(admin, TENANT)
    admin.create(
        modelcache(SERVED, TENANT, node_selector=on_node, source={"huggingface": {"repo": SERVED_REPO}})
    )
    admin.create(busybox_pod("reader", TENANT, READER, cache=SERVED))
    wait_for("the first cache Ready", lambda: cache_status(admin, SERVED).get("phase") == names.PHASE_READY,
             DEADLINE)  # fmt: skip
    wait_for("the reader Running", lambda: core(admin).read_namespaced_pod("reader", TENANT).status.phase
             == "Running", DEADLINE)  # fmt: skip
    read_lines = wait_new_reads(admin, 0, "before the upgrade")
    reader = reader_container(admin)
    mounts = mount_points_of(reader[0])
    assert len(mounts) == 1, mounts

    # ---- a second cache downloading at a CDN's per-connection rate ----
    hub.faults.rate = RATE
    assert hub.bytes_by_path.get(LARGE_FILE, 0) == 0
    admin.create(
        modelcache(LARGE, TENANT, node_selector=on_node, source={"huggingface": {"repo": LARGE_REPO}})
    )
    # More than the parts in flight fetched already: a download started over would exceed the bound.
    wait_for("the second cache's status showing its download past the parts in flight",
             lambda: int((cache_status(admin, LARGE).get("progress") or {}).get("bytesDone") or 0)
             > IN_FLIGHT, DEADLINE, interval=0.5)  # fmt: skip
    progress = cache_status(admin, LARGE)["progress"]
    assert progress["bytesTotal"] > LARGE_SIZE and progress["bytesDone"] < 3 * LARGE_SIZE // 4, progress

    # ---- helm upgrade: a value of the node DaemonSet's Pod template, and nothing the hooks read ----
    hooks_generation = generation(admin, "Deployment", HOOKS)
    daemonset_name = daemons.daemonset["metadata"]["name"]
    daemonset_generation = generation(admin, "DaemonSet", daemonset_name)
    helm.run(f"helm upgrade {RELEASE} charts/praesto --namespace {NAMESPACE} --reuse-values "
             "--set nodeAgent.logLevel=debug")  # fmt: skip
    assert generation(admin, "DaemonSet", daemonset_name) == daemonset_generation + 1
    assert generation(admin, "Deployment", HOOKS) == hooks_generation  # the hooks do not roll
    release.objects = helm.manifest(RELEASE, NAMESPACE)

    # ---- this node's Pod replaced as the DaemonSet controller does it: old Pod gone, then the new ----
    assert daemons.agent is not None and daemons.agent.process is not None and daemons.pod is not None
    old_agent, old_pod = daemons.agent.process, daemons.pod["metadata"]["uid"]
    daemons.remove_pod()
    assert old_agent.returncode is not None  # the old agent really stopped
    served_at_stop = hub.bytes_by_path.get(LARGE_FILE, 0)
    assert IN_FLIGHT < served_at_stop < LARGE_SIZE - PART, (
        f"the old agent stopped after {served_at_stop} bytes of {LARGE_SIZE}: the test needs more than the "
        f"{IN_FLIGHT} bytes in flight and less than the file"
    )
    assert not (daemons.base / TENANT / LARGE / names.COMPLETE_FILE).exists()
    read_lines = wait_new_reads(admin, read_lines, "while the node has no agent or CSI plugin")
    log_offset = daemons.workdir.joinpath("agent.log").stat().st_size
    daemons.create_pod()
    assert daemons.agent is not None and daemons.agent.process is not None and daemons.pod is not None
    assert daemons.pod["metadata"]["uid"] != old_pod
    assert agent_env(daemons.daemonset)[names.ENV_LOG_LEVEL] == "DEBUG"  # the upgraded template
    assert process_env(daemons.agent.process.pid)[names.ENV_LOG_LEVEL] == "DEBUG"

    # ---- the download resumes: the file fetched once, plus at most the parts in flight ----
    wait_for("the second cache Ready", lambda: cache_status(admin, LARGE).get("phase") == names.PHASE_READY,
             DEADLINE)  # fmt: skip
    served = hub.bytes_by_path[LARGE_FILE]
    assert served <= LARGE_SIZE + IN_FLIGHT, (
        f"the hub served {served} bytes of {LARGE_FILE} ({LARGE_SIZE} bytes): more than the file plus the "
        f"parts in flight when the agent was replaced ({PART}-byte parts x --concurrency={CONCURRENCY} = "
        f"{IN_FLIGHT}); {served_at_stop} had been served before the old agent stopped"
    )
    records = agent_records(daemons.workdir / "agent.log", log_offset)
    (done,) = [r for r in records if r.get("msg") == "downloaded" and r.get("cache") == LARGE]
    assert done["resumed"] >= served_at_stop - IN_FLIGHT > 0, done  # what the journal held, taken over
    print(f"{LARGE_FILE}: {LARGE_SIZE} bytes; served {served_at_stop} before the old agent stopped, "
          f"{served} in all; the new agent resumed {done['resumed']}, fetched {done['fromOrigin']}")  # fmt: skip

    # ---- the reader: the same container all along, its mount kept, the same bytes read ----
    wait_new_reads(admin, read_lines, "after the replacement")
    assert reader[2] == 0 and reader_container(admin) == reader
    assert mount_points_of(reader[0]) == mounts


def uninstall(helm: HelmCli, admin: Kube) -> None:
    """The caches and the Pod go first (the uninstall refuses while caches exist), then the release."""
    objects = helm.manifest(RELEASE, NAMESPACE)
    delete_pod(admin, "reader", TENANT)
    for name in (SERVED, LARGE):
        admin.delete(names.API_VERSION, names.MODELCACHE_KIND, name, TENANT)

    def gone() -> bool:
        return not any(admin.list(names.API_VERSION, kind) for kind in (names.MODELCACHE_KIND,
                       names.MODELCACHENODE_KIND))  # fmt: skip

    wait_for("every ModelCache and ModelCacheNode gone", gone, DEADLINE)
    helm.run(f"helm uninstall {RELEASE} --namespace {NAMESPACE}")
    wait_for("every object of the release gone", lambda: not still_there(admin, objects), 60)
    assert client.CoreV1Api(admin.api).list_namespaced_pod(TENANT).items == []
