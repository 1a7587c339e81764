"""`praesto-agent run`: flags, Kubernetes client set-up, metrics server, signals.

Everything with behaviour lives in `node_agent.Agent` and its collaborators; this is the process edge.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType

from kubernetes import client, config
from praesto.agent import baselock, capacity, logs
from praesto.agent.budget.config import add_budget_arguments, build_budget, check_budget_arguments
from praesto.agent.credentials import CredentialPolicy
from praesto.agent.kube import KubeApi
from praesto.agent.metrics import FROM_LOCAL, METRICS_FROM, AgentMetrics
from praesto.agent.node_agent import Agent
from praesto.agent.peers.config import add_peer_arguments, build_peering, check_peer_arguments
from praesto.agent.reconcile import AgentConfig
from praesto.agent.startup_taint import StartupTaint

from praesto import credscope, names, quota
from praesto.quantity import QuantityError
from praesto.store import StoreLayout


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags with environment defaults: a default given as a string is converted by argparse
    with the flag's type, so a bad value in the environment is refused naming the flag."""
    add = parser.add_argument
    add(
        "--node-name",
        default=os.environ.get(names.ENV_NODE_NAME),
        help="this node (env NODE_NAME, from the downward API)",
    )
    add("--base-path", default=os.environ.get("PRAESTO_BASE_PATH", names.DEFAULT_BASE_PATH),
        help="node-local store; must already exist (default %(default)s)")  # fmt: skip
    add("--concurrency", type=int, default=os.environ.get("PRAESTO_CONCURRENCY") or "8",
        help="parallel connections per download (default %(default)s)")  # fmt: skip
    add("--max-parallel-caches", type=int, default=os.environ.get("PRAESTO_MAX_PARALLEL_CACHES") or "2",
        help="caches downloading at once on this node (default %(default)s)")  # fmt: skip
    add("--reserve", default=os.environ.get("PRAESTO_RESERVE") or None,
        help="disk kept free: a quantity (50Gi) or a percent (15%%); default the larger of 30Gi and 15%% of the disk")  # fmt: skip
    add("--metrics-port", type=int, default=os.environ.get("PRAESTO_METRICS_PORT") or "9090",
        help="Prometheus /metrics port, 0 to disable (default %(default)s)")  # fmt: skip
    add(
        "--metrics-address",
        default=os.environ.get("PRAESTO_METRICS_ADDRESS", "0.0.0.0"),
        help=argparse.SUPPRESS,
    )
    add("--metrics-from", choices=METRICS_FROM, default=os.environ.get("PRAESTO_METRICS_FROM") or FROM_LOCAL,
        help="who may read /metrics (it names every tenant's caches): 'local', only inside the agent's "
        "Pod (kubectl port-forward, a sidecar); 'any', every client that reaches the port (the chart "
        "then admits only nodeAgent.metrics.allowedNamespaces with a NetworkPolicy). /healthz "
        "answers everyone (default %(default)s)")  # fmt: skip
    add(
        "--hf-endpoint",
        default=os.environ.get(names.ENV_HF_ENDPOINT),
        help="Hugging Face endpoint or mirror (env HF_ENDPOINT)",
    )
    add(
        "--ca-bundle",
        default=os.environ.get(names.ENV_CA_BUNDLE),
        help="extra PEM CA bundle every download trusts besides the system roots "
        "(env PRAESTO_CA_BUNDLE; chart downloads.caBundle)",
    )
    add(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig for development; in-cluster config otherwise",
    )
    add("--log-format", choices=("json",), default="json", help=argparse.SUPPRESS)
    add("--startup-taint-key", default=os.environ.get("PRAESTO_STARTUP_TAINT_KEY", names.DEFAULT_STARTUP_TAINT_KEY),
        help="taint this node may have joined with; lifted once its warmNewNodes caches are on disk "
        "(empty: never touch the Node) (default %(default)s)")  # fmt: skip
    add("--startup-taint-deadline", type=float, default=os.environ.get("PRAESTO_STARTUP_TAINT_DEADLINE") or "1800",
        help="seconds after the Node's creation when the taint is lifted anyway, with Events (default %(default)s)")  # fmt: skip
    add("--warm-namespaces", type=credscope.split_list, default=os.environ.get("PRAESTO_WARM_NAMESPACES", ""),
        help="comma-separated namespaces whose warmNewNodes caches may hold a new node's startup taint; "
        "none by default (chart nodeAgent.startupTaint.namespaces)")  # fmt: skip
    add_peer_arguments(parser)
    add_budget_arguments(parser)


def check_arguments(args: argparse.Namespace) -> str | None:
    """The first problem with the flags, named with its fix, or None."""
    if not args.node_name:
        return "--node-name: Required value; set it or NODE_NAME (fieldRef spec.nodeName in the DaemonSet)"
    if args.concurrency < 1 or args.max_parallel_caches < 1:
        return "--concurrency and --max-parallel-caches must be at least 1"
    if args.startup_taint_deadline <= 0:
        return (
            f"--startup-taint-deadline: {args.startup_taint_deadline:g} must be positive seconds, e.g. 1800"
        )
    bad = [n for n in args.warm_namespaces if not names.is_dns_label(n)]
    if bad:
        return (
            f"--warm-namespaces: {', '.join(bad)} is not a namespace name; list namespaces, comma-separated"
        )
    if not 0 <= args.metrics_port <= 65535:
        return f"--metrics-port: {args.metrics_port} is not a port; use 1-65535, or 0 to disable"
    try:
        capacity.check_reserve(args.reserve)
    except QuantityError as err:
        return f"--reserve: {err}; use e.g. 50Gi or 15%"
    try:
        quota.from_env(os.environ)
    except quota.QuotaError as err:
        return f"{err} (env {quota.ENV})"
    return check_peer_arguments(args) or check_budget_arguments(args)


def api_client(kubeconfig: str | None) -> client.ApiClient:
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


def build(args: argparse.Namespace, api: client.ApiClient) -> Agent:
    cfg = AgentConfig(
        node_name=args.node_name,
        base_path=Path(args.base_path),
        endpoint=args.hf_endpoint,
        ca_bundle=args.ca_bundle,
        store_env=dict(os.environ),  # for the store clients (workload identity, endpoints), read now
        concurrency=args.concurrency,
        max_parallel_caches=args.max_parallel_caches,
        reserve=args.reserve,
        quotas=quota.from_env(os.environ),
    )
    peering = build_peering(args, api, StoreLayout(cfg.base_path))
    budget = build_budget(args, api)
    credentials = CredentialPolicy.from_env(os.environ)  # the chart's credentials settings, read once
    kube = KubeApi(api, args.node_name)
    return Agent(cfg, kube, AgentMetrics.create(), peering=peering, budget=budget, credentials=credentials)


def run(args: argparse.Namespace) -> int:
    logs.configure(getattr(args, "log_level", "INFO") or "INFO")
    # the downloader's own info lines lack the cache's names; the agent logs each download with them
    logging.getLogger("praesto.download").setLevel(logging.WARNING)
    problem = check_arguments(args)
    log = logs.logger("praesto.agent", node=args.node_name or "")
    if problem:
        log.error(problem)
        return 2
    try:
        api = api_client(args.kubeconfig)
        agent = build(args, api)
    except (config.ConfigException, OSError) as err:
        log.error(f"cannot reach the Kubernetes API: {err}; run in-cluster or pass --kubeconfig")
        return 1
    if args.metrics_port:
        agent.metrics.serve(args.metrics_port, args.metrics_address, args.metrics_from)
    stopped = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping", extra={"signal": signal.Signals(signum).name})
        stopped.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        agent.start()
    except (baselock.BasePathInUse, OSError) as err:
        log.error(str(err))
        return 1
    taint = None
    if args.startup_taint_key:
        complete = agent.layout.is_complete
        taint = StartupTaint(
            api, agent.kube, args.node_name, args.startup_taint_key, args.startup_taint_deadline, complete,
            args.warm_namespaces,
        )  # fmt: skip
        taint.start()
    while not stopped.wait(1.0):
        if agent.fatal:  # e.g. the base path appeared, but another agent had locked it first
            break
    if taint is not None:
        taint.stop()
    agent.stop()
    return 1 if agent.fatal else 0
