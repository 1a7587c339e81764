"""A running node agent wired to the real API server (through the fault proxy) and the local hub.

Everything is real: the agent's `kubernetes` client talks HTTP to the fault proxy in
front of the real kube-apiserver (testkit/kube_real.py, the `kube` fixture)
as the agent's ServiceAccount, so the real RBAC decides its calls (and the request log
holds them to `praesto.rbac`'s narrower list: `rbac_violations`), the downloader talks HTTP to the local hub, bytes land in a temp base path.
Timings are shrunk (tick 0.1 s, retries from 0.2 s) and the wall clock the
agent uses for TTLs can be pushed forward (`env.skip(seconds)`).
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from praesto.agent import logs
from praesto.agent.credentials import CredentialPolicy
from praesto.agent.download.api import EngineSettings
from praesto.agent.kube import KubeApi
from praesto.agent.metrics import AgentMetrics
from praesto.agent.node_agent import Agent
from praesto.agent.reconcile import LoopTuning
from praesto.agent.settings import AgentSettings, ScrubSettings

from praesto import names, rbac
from praesto.reflector import Backoff
from praesto.store import StoreLayout
from testkit.egress import LOOPBACK
from testkit.hub import LocalHub
from testkit.kube_faults import RequestRecord
from testkit.kube_real import RealKube
from testkit.objects import modelcachenode
from testkit.peer_cluster import agent_client

NODE = "node-a"
MCN = f"{names.MODELCACHENODE_PLURAL}.{names.GROUP}"
Obj = dict[str, Any]


@dataclass
class Env:
    kube: RealKube
    hub: LocalHub
    base: Path
    log: io.StringIO = field(default_factory=io.StringIO)
    agent: Agent | None = None
    offset: float = 0.0  # seconds added to the agent's wall clock
    trust_dir: Path | None = None  # the platform's trust ConfigMap as mounted (--trust-dir), if any

    @property
    def layout(self) -> StoreLayout:
        return StoreLayout(self.base)

    def clock(self) -> float:
        return time.time() + self.offset

    def skip(self, seconds: float) -> None:
        self.offset += seconds

    def start(self, **overrides: Any) -> Agent:
        """An agent with `AgentSettings` and `LoopTuning` fields from `overrides` (by name; the scrub's
        as scrub_interval / scrub_bytes_per_second)."""
        tuning = LoopTuning(tick_seconds=0.1, progress_seconds=0.2, retry_initial=0.2, retry_max=1.0,
                            watch_backoff=Backoff(0.05, 0.5))  # fmt: skip
        tuning = replace(tuning, **{k: overrides.pop(k) for k in list(overrides) if hasattr(tuning, k)})
        scrub = ScrubSettings(
            overrides.pop("scrub_interval", 0.0),  # off unless a test turns it on
            overrides.pop("scrub_bytes_per_second", ScrubSettings.bytes_per_second),
        )
        settings = AgentSettings(
            node_name=NODE,
            base_path=self.base,
            hf_endpoint=self.hub.endpoint,
            concurrency=4,
            reserve="0",
            scrub=scrub,
            # as praesto-agent run takes it at start (agent/settings.py)
            environment=EngineSettings.from_environment(os.environ),
            egress=LOOPBACK,  # the hub, registries and stores of these tests listen on loopback
        )
        settings = replace(settings, **overrides)
        logs.configure("DEBUG", self.log)
        api = KubeApi(agent_client(self.kube), NODE, watch_timeout=5)
        # the chart's credentials settings, read at start as praesto-agent run does (agent/settings.py)
        credentials = CredentialPolicy.from_env(os.environ, str(self.trust_dir) if self.trust_dir else None)
        self.agent = Agent(
            settings, api, AgentMetrics.create(), clock=self.clock, credentials=credentials, tuning=tuning
        ).start()
        return self.agent

    def metric(self, name: str, **labels: str) -> float:
        assert self.agent is not None
        return self.agent.metrics.value(name, **labels)

    # ---- objects -----------------------------------------------------------

    def add_model(self, cache: str, **files: bytes) -> str:
        """A hub repo `org/<cache>` holding `files` (keys use `__` for `/`); returns its commit."""
        return self.hub.add_repo(f"org/{cache}", {k.replace("__", "/"): v for k, v in files.items()})

    def create_mcn(
        self,
        cache: str,
        *,
        namespace: str = "team-a",
        node: str = NODE,
        repo: str | None = None,
        size: str = "1Gi",
        ttl: str | None = None,
        secret: tuple[str, str] | None = None,
    ) -> Obj:
        source: Obj = {"uri": f"hf://{repo or 'org/' + cache}", "revision": "main"}
        if secret:
            source["secretRef"] = {"name": secret[0], "key": secret[1]}
        return self.kube.create(
            modelcachenode(cache, node, namespace, source=source, size=size, unused_ttl=ttl)
        )

    def create_secret(self, namespace: str, name: str, key: str, value: str) -> None:
        self.kube.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "data": {key: base64.b64encode(value.encode()).decode()},
            }
        )

    def get(self, cache: str, namespace: str = "team-a", node: str = NODE) -> Obj | None:
        return self.kube.get(MCN, names.modelcachenode_name(cache, node), namespace)

    def status(self, cache: str, namespace: str = "team-a", node: str = NODE) -> Obj:
        obj = self.get(cache, namespace, node)
        return (obj or {}).get("status") or {}

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        try:
            self.kube.wait_until(predicate, timeout, what)
        except TimeoutError as err:
            raise TimeoutError(f"{err}; agent log tail:\n{self.log.getvalue()[-2000:]}") from None

    def wait_phase(self, cache: str, phase: str, namespace: str = "team-a", timeout: float = 30.0) -> Obj:
        self.wait(
            lambda: self.status(cache, namespace).get("phase") == phase,
            f"{namespace}/{cache} {phase}",
            timeout,
        )
        return self.status(cache, namespace)

    def wait_reason(self, cache: str, reason: str, namespace: str = "team-a", timeout: float = 30.0) -> Obj:
        """The status in which the Ready condition first showed `reason` (not a later read)."""
        seen: list[Obj] = []

        def shows_reason() -> bool:
            seen[:] = [self.status(cache, namespace)]
            return ready_condition(seen[0]).get("reason") == reason

        self.wait(shows_reason, f"{namespace}/{cache} reason {reason}", timeout)
        return seen[0]


def ready_condition(status: Obj) -> Obj:
    for c in status.get("conditions") or []:
        if c.get("type") == "Ready":
            return dict(c)
    return {}


def rbac_violations(requests: list[RequestRecord]) -> list[RequestRecord]:
    """Calls outside `praesto.rbac.AGENT` and `AGENT_PEERS` (the per-cache grants, Secrets and a
    verification ConfigMap: namespaced `get` by name only)."""
    allowed = {(p.group, p.resource, verb) for p in rbac.AGENT + rbac.AGENT_PEERS for verb in p.verbs}
    grants: dict[tuple[str, str], set[str]] = {}
    for g in (rbac.AGENT_SECRET_GRANT, rbac.AGENT_CONFIGMAP_GRANT, rbac.AGENT_TRUST_SECRET_GRANT,
              rbac.AGENT_TRUST_CONFIGMAP_GRANT):  # fmt: skip
        grants.setdefault((g.group, g.resource), set()).update(g.verbs)
    bad = []
    for r in requests:
        verbs = grants.get((r.group, r.resource))
        if verbs is not None:
            # by name: a get of it, or a list/watch of it alone (fieldSelector metadata.name, the trust
            # ConfigMap's watch) where the grant has those verbs (never on Secrets)
            named = r.name or r.query.get("fieldSelector", "").startswith("metadata.name=")
            if not (r.verb in verbs and r.namespace and named):
                bad.append(r)
        elif (r.group, r.resource, r.verb) not in allowed:
            bad.append(r)
    return bad


def dump_api(kube: RealKube, exclude_kind: str = "Secret") -> str:
    """Every stored object but Secrets, as text (to grep for leaked tokens)."""
    out: list[str] = []
    for resource in (MCN, "events", "events.events.k8s.io"):
        out.extend(json.dumps(o) for o in kube.list(resource) if o.get("kind") != exclude_kind)
    return "\n".join(out)


def tree(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.name.startswith(".praesto")
    }


def env_context(kube: RealKube, tmp_path: Path, base: Path | None = None) -> Iterator[Env]:
    """The API server (the `kube` fixture) + hub + base dir; stops the agent and checks RBAC use on the way out."""
    base = base or tmp_path / "store"
    if base == tmp_path / "store":
        base.mkdir()
    with LocalHub(tmp_path / "hub") as hub:
        env = Env(kube, hub, base)
        try:
            yield env
        finally:
            if env.agent is not None:
                env.agent.stop()
        assert rbac_violations(kube.requests) == []


def set_mtime(path: Path, when: float) -> None:
    os.utime(path, (when, when))
