"""`praesto-agent run`: settings, Kubernetes client set-up, metrics server, signals.

Everything with behaviour lives in `node_agent.Agent` and its collaborators; this is the process
edge. Its flags and settings are agent/settings.py's `AgentSettings`, built here once.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Mapping
from dataclasses import replace
from types import FrameType

from praesto.agent import baselock, logs
from praesto.agent.broker_client import Broker
from praesto.agent.budget.config import build_budget
from praesto.agent.kube import Door, KubeApi, NoApiConfig, api_client
from praesto.agent.metrics import AgentMetrics
from praesto.agent.node_agent import Agent
from praesto.agent.peers.auth import TokenMinter
from praesto.agent.peers.config import build_peering
from praesto.agent.settings import AgentSettings, SettingsError
from praesto.agent.startup_taint import StartupTaint

from praesto import names
from praesto.store import StoreLayout


def build(settings: AgentSettings, door: Door) -> Agent:
    peering = build_peering(settings.peers, door, settings.node_name, StoreLayout(settings.base_path))
    budget = build_budget(settings.origin_budget, door, settings.node_name)
    kube = KubeApi(door.client, settings.node_name)
    metrics = AgentMetrics.create()
    credentials = settings.credentials
    if settings.broker is not None:  # a cache's own Secret, for this node's copies only (hooks/broker.py)
        broker = Broker(settings.broker, TokenMinter(door, settings.broker.pod))
        credentials = replace(credentials, broker=broker)
    return Agent(settings, kube, metrics, peering=peering, budget=budget, credentials=credentials)


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """`praesto-agent run` with its parsed flags and the process environment they defaulted from."""
    logs.configure(getattr(args, "log_level", None) or names.DEFAULT_LOG_LEVEL)
    # the downloader's own info lines lack the cache's names; the agent logs each download with them
    logging.getLogger("praesto.download").setLevel(logging.WARNING)
    log = logs.logger("praesto.agent", node=args.node_name or "")
    try:
        settings = AgentSettings.from_args(args, env)
    except SettingsError as problem:
        log.error(str(problem))
        return 2
    try:
        door = Door(api_client(settings.kubeconfig))
        agent = build(settings, door)
    except (NoApiConfig, OSError) as err:
        log.error(f"cannot reach the Kubernetes API: {err}; run in-cluster or pass --kubeconfig")
        return 1
    metrics = settings.metrics
    if metrics.port:
        agent.metrics.serve(metrics.port, metrics.address, metrics.allowed_from)
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
    taint, startup = None, settings.startup_taint
    if startup.key:
        complete = agent.layout.is_complete
        taint = StartupTaint(
            door, agent.kube, settings.node_name, startup.key, startup.deadline_seconds, complete,
            startup.warm_namespaces,
        )  # fmt: skip
        taint.start()
    while not stopped.wait(1.0):
        if agent.fatal:  # e.g. the base path appeared, but another agent had locked it first
            break
    if taint is not None:
        taint.stop()
    agent.stop()
    return 1 if agent.fatal else 0
