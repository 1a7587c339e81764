"""Sync hook cost at scale, with Node objects as the real API server serves them, and the server's rate.

1. A 2,000-node cluster where one local-mode ModelCache selects 50 GPU nodes
   (`nodeSelector`), each Node as kube-apiserver returns it: labels, annotations,
   managedFields, status with conditions, addresses, nodeInfo and ~40 images.
   Two request shapes, interleaved round by round:
   * the old related rule (`namespace: "*"`): every Node of the cluster in `related`;
   * the selector rule (`labelSelector` = spec.nodeSelector): only the 50 selected.
   Each round times what the hooks process does per request (json.loads + sync +
   json.dumps of the answer); printed as min/median/max per shape, request size,
   and the ratio of medians. The selector rule also limits which Node heartbeats
   wake the cache at all (Metacontroller resyncs a parent on every related change).
2. Requests/s of a real `praesto-hooks` (gunicorn, HTTPS) for a 10-node sync request.

Run: python -m bench.hooks_bench
"""

from __future__ import annotations

import http.client
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from praesto.hooks import hook_protocol
from praesto.hooks.config import HooksConfig
from praesto.hooks.modelcache import sync

from testkit.hook_objects import NOW, mcn, modelcache, node_status, sync_request
from testkit.server import hooks_server

SIZE = 4_400_000_000
CLUSTER_NODES = 2000
GPU_NODES = 50
ROUNDS = 5
GPU = {"nvidia.com/gpu.present": "true"}


def api_server_node(name: str, gpu: bool) -> dict[str, Any]:
    """A Node as `kubectl get node -o json` shows one on a managed cluster (~20 KB)."""
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p4d.24xlarge" if gpu else "m6i.4xlarge",
        "topology.kubernetes.io/region": "eu-west-1",
        "topology.kubernetes.io/zone": "eu-west-1a",
        "eks.amazonaws.com/nodegroup": "gpu" if gpu else "general",
        "eks.amazonaws.com/capacityType": "ON_DEMAND",
        **(GPU if gpu else {}),
    }
    now = "2026-12-02T10:00:00Z"
    images = [
        {
            "names": [
                f"registry.example.com/team-{i % 7}/service-{i}@sha256:{i:064x}",
                f"registry.example.com/team-{i % 7}/service-{i}:v1.{i}.0",
            ],
            "sizeBytes": 100_000_000 + i * 7_340_032,
        }
        for i in range(40)
    ]
    managed = [
        {
            "manager": manager,
            "operation": "Update",
            "apiVersion": "v1",
            "time": now,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:labels": {f"f:{k}": {} for k in labels}},
                "f:status": {
                    "f:conditions": {
                        f'k:{{"type":"{t}"}}': {"f:lastHeartbeatTime": {}}
                        for t in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
                    }
                },
            },
            **({"subresource": "status"} if manager == "kubelet" else {}),
        }
        for manager in ("kubelet", "kube-controller-manager", "aws-cloud-controller-manager")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"00000000-0000-0000-0000-{abs(hash(name)) % 10**12:012d}",
            "resourceVersion": "123456789",
            "creationTimestamp": now,
            "labels": labels,
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": "10.0.0.1",
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": json.dumps(
                    {"csi.praesto.io": name, "ebs.csi.aws.com": "i-0123456789abcdef0"}
                ),
            },
            "managedFields": managed,
        },
        "spec": {
            "providerID": f"aws:///eu-west-1a/i-{abs(hash(name)) % 16**17:017x}",
            "podCIDR": "10.1.0.0/24",
            "podCIDRs": ["10.1.0.0/24"],
        },
        "status": {
            "capacity": {
                "cpu": "96",
                "memory": "1176294268Ki",
                "pods": "110",
                "ephemeral-storage": "1953513476Ki",
                **({"nvidia.com/gpu": "8"} if gpu else {}),
            },
            "allocatable": {
                "cpu": "95690m",
                "memory": "1165032316Ki",
                "pods": "110",
                "ephemeral-storage": "1800324764Ki",
                **({"nvidia.com/gpu": "8"} if gpu else {}),
            },
            "conditions": [
                {
                    "type": t,
                    "status": "True" if t == "Ready" else "False",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                    "reason": f"Kubelet{t}",
                    "message": f"kubelet reports {t}",
                }
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
                {"type": "InternalDNS", "address": f"{name}.eu-west-1.compute.internal"},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "ec2" + "0" * 29,
                "systemUUID": "ec2" + "0" * 33,
                "bootID": "0" * 36,
                "kernelVersion": "6.1.112-124.190.amzn2023.x86_64",
                "osImage": "Amazon Linux 2023.6.20241010",
                "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images,
        },
    }


def cluster_request(all_nodes_rule: bool) -> bytes:
    """The sync request Metacontroller 4.17.2 builds for the GPU cache under one of the two rules."""
    spec = {
        "source": {"huggingface": {"repo": "TinyLlama/TinyLlama-1.1B-Chat-v1.0"}},
        "storage": {"size": "5Gi"},
        "nodeSelector": dict(GPU),
    }
    nodes = [
        api_server_node(f"ip-10-0-{i // 250}-{i % 250}", gpu=i < GPU_NODES) for i in range(CLUSTER_NODES)
    ]
    related = nodes if all_nodes_rule else [n for n in nodes if n["metadata"]["labels"].get(next(iter(GPU)))]
    children = [
        mcn("tinyllama", n["metadata"]["name"], node_status("Downloading", 1_000_000, SIZE, sizeBytes=SIZE))
        for n in nodes[:GPU_NODES]
    ]
    return json.dumps(
        sync_request(modelcache("tinyllama", spec=spec), nodes=related, children=children)
    ).encode()


def spread(samples: list[float]) -> str:
    return f"min {min(samples) * 1e3:7.1f}  median {statistics.median(samples) * 1e3:7.1f}  max {max(samples) * 1e3:7.1f} ms"


def bench_sync(rounds: int = ROUNDS) -> None:
    config = HooksConfig()
    bodies = {
        'all Nodes (namespace: "*")': cluster_request(True),
        "selector (spec.nodeSelector)": cluster_request(False),
    }
    times: dict[str, list[float]] = {name: [] for name in bodies}
    for _ in range(rounds):  # interleaved: each round runs both shapes
        for name, body in bodies.items():
            started = time.perf_counter()
            response = sync(json.loads(body), config, NOW)
            json.dumps(response)
            times[name].append(time.perf_counter() - started)
            assert hook_protocol.check_response("sync", response) == []
            assert len(response["children"]) == GPU_NODES
    print(
        f"sync of one cache selecting {GPU_NODES} of {CLUSTER_NODES} Nodes (API-server-shaped), {rounds} interleaved rounds"
    )
    for name, body in bodies.items():
        related = CLUSTER_NODES if "all" in name else GPU_NODES
        print(
            f"  {name:32s} request {len(body) / 1e6:6.1f} MB, {related:5d} related Nodes: {spread(times[name])}"
        )
    old, new = (statistics.median(t) for t in times.values())
    print(
        f"  ratio of medians (all / selector): {old / new:.1f}x time, {len(next(iter(bodies.values()))) / len(list(bodies.values())[1]):.1f}x bytes"
    )


def bench_server(seconds: float = 5.0, clients: int = 4, workers: int = 2, threads: int = 4) -> None:
    nodes = [api_server_node(f"node-{i}", gpu=True) for i in range(10)]
    children = [mcn("tinyllama", n["metadata"]["name"], node_status("Ready")) for n in nodes]
    body = json.dumps(sync_request(modelcache("tinyllama"), nodes=nodes, children=children)).encode()
    done: list[float] = []
    lock = threading.Lock()
    with (
        tempfile.TemporaryDirectory() as tmp,
        hooks_server(Path(tmp), tls=True, workers=workers, threads=threads) as server,
    ):
        host, port = server.base_url.removeprefix("https://").split(":")

        def client() -> None:
            deadline = time.monotonic() + seconds
            # Keep-alive HTTPS, as Metacontroller's client calls the one TLS listener.
            conn = http.client.HTTPSConnection(host, int(port), timeout=10, context=server.ssl_context())
            local = []
            while time.monotonic() < deadline:
                started = time.perf_counter()
                conn.request("POST", "/hooks/modelcache/sync", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200
                local.append(time.perf_counter() - started)
            conn.close()
            with lock:
                done.extend(local)

        threads_ = [threading.Thread(target=client) for _ in range(clients)]
        started = time.perf_counter()
        for t in threads_:
            t.start()
        for t in threads_:
            t.join()
        elapsed = time.perf_counter() - started
    print(
        f"praesto-hooks (gunicorn {workers} workers x {threads} threads, HTTPS), 10-node sync, {clients} clients: "
        f"{len(done) / elapsed:.0f} req/s, median {statistics.median(done) * 1e3:.1f} ms, "
        f"p99 {sorted(done)[int(len(done) * 0.99)] * 1e3:.1f} ms"
    )


def main() -> None:
    bench_sync()
    bench_server()


if __name__ == "__main__":
    main()
