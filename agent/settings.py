"""`praesto-agent run`'s settings: one typed tree, built once at the process edge from flags and environment.

`add_run_arguments` declares the flags; each defaults to its environment variable, taken from the
mapping the edge hands in (agent/cli.py `main`, the one place `praesto-agent` reads the process
environment), so a flag wins over its variable, and a default given as a string is converted by
argparse with the flag's type (a bad value in the environment is refused naming the flag).
`AgentSettings.from_args` checks the parsed flags together (a `SettingsError` names the flag, the
cause and the fix) and reads the chart's credentials and quotas from the same mapping. Below this,
nothing reads the environment: the daemon and its collaborators take their section of the tree.

The chart sets the flags and variables on the node DaemonSet's agent container
(templates/node-daemonset.yaml); tests/test_settings_inventory.py checks the two against each other.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from urllib.parse import urlsplit

from praesto.agent import capacity
from praesto.agent.broker_client import (
    BrokerEndpoint,
    add_broker_arguments,
    broker_endpoint,
    check_broker_arguments,
)
from praesto.agent.budget.config import add_budget_arguments, budget_config, check_budget_arguments
from praesto.agent.budget.origin_budget import BudgetConfig
from praesto.agent.credentials import CredentialPolicy
from praesto.agent.download import egress
from praesto.agent.download.api import WRITE_DIRECT, WRITE_MODES, EngineSettings
from praesto.agent.download.egress import EgressPolicy
from praesto.agent.metrics import FROM_LOCAL, METRICS_FROM
from praesto.agent.peers.config import add_peer_arguments, check_peer_arguments, peer_config
from praesto.agent.peers.peering import PeerConfig

from praesto import credscope, names, quota
from praesto.quantity import QuantityError, parse_duration, parse_quantity

ENV_MODELSCOPE_ENDPOINT = names.ENV_MODELSCOPE_ENDPOINT  # ModelScope's own client variable


class SettingsError(ValueError):
    """A bad flag or variable: names it, says what is wrong and what to set."""


@dataclass(frozen=True)
class MetricsSettings:
    """The Prometheus /metrics and /healthz server (chart nodeAgent.metricsPort and .metrics)."""

    port: int = 9090
    """--metrics-port (PRAESTO_METRICS_PORT): the server's port; 0 disables it."""
    address: str = "0.0.0.0"  # every interface of the Pod; --metrics-from says who may read
    """--metrics-address (PRAESTO_METRICS_ADDRESS, not in --help): where the server binds."""
    allowed_from: str = FROM_LOCAL
    """--metrics-from (PRAESTO_METRICS_FROM): 'local', /metrics answers only inside the agent's Pod;
    'any', every client that reaches the port (the chart's NetworkPolicy then chooses who)."""


@dataclass(frozen=True)
class StartupTaintSettings:
    """The taint a new node may join with, lifted once its warmNewNodes caches are on disk
    (chart nodeAgent.startupTaint; agent/startup_taint.py)."""

    key: str = names.DEFAULT_STARTUP_TAINT_KEY
    """--startup-taint-key (PRAESTO_STARTUP_TAINT_KEY): the taint's key; empty: never touch the Node."""
    deadline_seconds: float = 1800.0
    """--startup-taint-deadline (PRAESTO_STARTUP_TAINT_DEADLINE): seconds after the Node's creation
    when the taint is lifted anyway, with Events."""
    warm_namespaces: tuple[str, ...] = ()
    """--warm-namespaces (PRAESTO_WARM_NAMESPACES, comma-separated): the namespaces whose
    warmNewNodes caches may hold the taint; none by default."""


@dataclass(frozen=True)
class ScrubSettings:
    """The at-rest scrub (chart nodeAgent.scrub; agent/scrub/)."""

    interval_seconds: float = 168 * 3600.0
    """--scrub-interval (PRAESTO_SCRUB_INTERVAL): a duration (168h); each Ready copy is re-hashed this
    long after its last scrub or after it became Ready; 0 disables the scrub."""
    bytes_per_second: int = 64 << 20
    """--scrub-bytes-per-second (PRAESTO_SCRUB_BYTES_PER_SECOND): a quantity (64Mi); the scrub's read budget."""


@dataclass(frozen=True)
class AgentSettings:
    """Everything `praesto-agent run` is configured with, checked; one per process."""

    node_name: str
    """--node-name (NODE_NAME, the downward API's spec.nodeName): this node. Required."""
    base_path: Path = Path(names.DEFAULT_BASE_PATH)
    """--base-path (PRAESTO_BASE_PATH): the node-local store; must already exist."""
    kubeconfig: str | None = None
    """--kubeconfig (KUBECONFIG): for development; in-cluster config when unset."""
    log_level: str = names.DEFAULT_LOG_LEVEL
    """--log-level (PRAESTO_LOG_LEVEL): DEBUG, INFO, WARNING or ERROR."""
    hf_endpoint: str | None = None
    """--hf-endpoint (HF_ENDPOINT): the Hugging Face endpoint or mirror; unset: huggingface.co."""
    modelscope_endpoint: str | None = None
    """--modelscope-endpoint (MODELSCOPE_ENDPOINT, chart downloader.modelscopeEndpoint): the ModelScope
    hub or mirror ms:// sources come from; unset: modelscope.cn (download/origins/modelscope/hubapi.py
    endpoint_of reads it from the download settings, `EngineSettings.modelscope_endpoint`)."""
    ca_bundle: str | None = None
    """--ca-bundle (PRAESTO_CA_BUNDLE, chart downloads.caBundle): an extra PEM CA bundle every
    download trusts besides the system roots."""
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    """--egress-allowed-cidrs (PRAESTO_EGRESS_ALLOWED_CIDRS, chart downloads.egress.allowedCIDRs):
    internal networks a cache's source, its redirects and token realms may reach; every loopback,
    link-local, metadata and private address is refused otherwise (download/egress.py)."""
    xet: bool = False
    """--xet (PRAESTO_XET, chart downloads.xet.enabled): 'true', Hugging Face files stored in Xet come
    through the Xet CAS, falling back to resolve/ on any failure (download/origins/huggingface/xetpath.py)."""
    concurrency: int = 8
    """--concurrency (PRAESTO_CONCURRENCY): parallel connections per download."""
    write_mode: str = WRITE_DIRECT
    """--write-mode (PRAESTO_WRITE_MODE, chart nodeAgent.writeMode): 'direct', large files' bytes go to
    a local-disk store with O_DIRECT, past the page cache (agent/download/writes.py; network and memory
    filesystems stay buffered anyway); 'buffered', always through the page cache."""
    max_parallel_caches: int = 2
    """--max-parallel-caches (PRAESTO_MAX_PARALLEL_CACHES): caches downloading at once on this node."""
    reserve: str | None = None
    """--reserve (PRAESTO_RESERVE): disk kept free, a quantity (50Gi) or a percent (15%); unset:
    the larger of 30Gi and 15% of the disk (agent/capacity.py)."""
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    """The metrics server."""
    startup_taint: StartupTaintSettings = field(default_factory=StartupTaintSettings)
    """The startup taint."""
    peers: PeerConfig | None = None
    """The --peer-* flags (chart nodeAgent.peers, agent/peers/config.py); None: peers are off
    (--peer-port 0)."""
    origin_budget: BudgetConfig | None = None
    """The --origin-budget-* flags (chart originBudget, agent/budget/config.py); None: off
    (--origin-budget-namespace empty)."""
    broker: BrokerEndpoint | None = None
    """--credentials-broker (chart: praesto-hooks): a cache's own Secret is asked of it, for this node's
    copies only (agent/broker_client.py); None: read with the agent's own identity (development)."""
    credentials: CredentialPolicy = field(default_factory=CredentialPolicy)
    """Who may use the cluster's credentials for what (chart credentials: PRAESTO_CREDENTIALS_SECRET,
    PRAESTO_CREDENTIALS_NAMESPACES, PRAESTO_CREDENTIALS_SOURCES)."""
    quotas: quota.Quotas = field(default_factory=quota.Quotas)
    """PRAESTO_NAMESPACE_QUOTAS (chart namespaceQuota): who gives room first when the disk is full."""
    scrub: ScrubSettings = field(default_factory=lambda: ScrubSettings())
    """The at-rest scrub (agent/scrub/)."""
    environment: EngineSettings = field(default_factory=EngineSettings, repr=False)
    """What downloads take from the environment as the process started (EngineSettings.from_environment:
    the proxies, the OCI mirrors, the object-store clients' variables), read once; `downloads` adds
    the flags to it."""

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str]) -> AgentSettings:
        """The settings from `praesto-agent run`'s parsed flags and the process environment `env`
        (the same mapping the flags' defaults came from); `SettingsError` names the first problem."""
        problem = check_arguments(args, env)
        if problem:
            raise SettingsError(problem)
        try:
            credentials = CredentialPolicy.from_env(
                env, args.trust_dir
            )  # the chart's credentials and trust, once
        except (ValueError, OSError) as error:
            raise SettingsError(f"--trust-dir: {error}") from None
        return cls(
            node_name=args.node_name,
            base_path=Path(args.base_path),
            kubeconfig=args.kubeconfig,
            log_level=str(getattr(args, "log_level", None) or names.DEFAULT_LOG_LEVEL),
            hf_endpoint=args.hf_endpoint,
            modelscope_endpoint=args.modelscope_endpoint or None,
            ca_bundle=args.ca_bundle,
            egress=EgressPolicy.from_text(args.egress_allowed_cidrs),
            xet=args.xet == "true",
            concurrency=args.concurrency,
            write_mode=args.write_mode,
            max_parallel_caches=args.max_parallel_caches,
            reserve=args.reserve,
            metrics=MetricsSettings(args.metrics_port, args.metrics_address, args.metrics_from),
            startup_taint=StartupTaintSettings(
                args.startup_taint_key, args.startup_taint_deadline, tuple(args.warm_namespaces)
            ),
            peers=peer_config(args),
            origin_budget=budget_config(args),
            broker=broker_endpoint(args),
            credentials=credentials,
            quotas=quota.from_env(env),
            scrub=ScrubSettings(
                _duration(args.scrub_interval), int(parse_quantity(args.scrub_bytes_per_second))
            ),
            environment=EngineSettings.from_environment(env),
        )

    @cached_property
    def downloads(self) -> EngineSettings:
        """Every download's settings section (download/api.py), built once from these and passed
        whole to the job runner (agent/jobs.py), which adds each download's request to it."""
        return replace(
            self.environment,  # the proxies, OCI mirrors and object-store variables, read at start
            endpoint=self.hf_endpoint,
            modelscope_endpoint=self.modelscope_endpoint,
            ca_bundle=self.ca_bundle,
            concurrency=self.concurrency,
            write_mode=self.write_mode,
            egress=self.egress,
            xet=self.xet,
        )


def add_run_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """`praesto-agent run`'s flags, each defaulting to its variable in `environ`: a default given
    as a string is converted by argparse with the flag's type, so a bad value in the environment
    is refused naming the flag."""
    env = environ.get
    add = parser.add_argument
    add(
        "--node-name",
        default=env(names.ENV_NODE_NAME),
        help=f"this node (env {names.ENV_NODE_NAME}, from the downward API)",
    )
    add("--base-path", default=env("PRAESTO_BASE_PATH", str(AgentSettings.base_path)),
        help="node-local store; must already exist (default %(default)s)")  # fmt: skip
    add("--concurrency", type=int, default=env("PRAESTO_CONCURRENCY") or str(AgentSettings.concurrency),
        help="parallel connections per download (default %(default)s)")  # fmt: skip
    add("--xet", choices=("true", "false"), default=env(names.ENV_XET) or "false",
        help="true: Hugging Face files stored in Xet come through the Xet CAS, falling back to resolve/ "
        "(env PRAESTO_XET; chart downloads.xet.enabled; default %(default)s)")  # fmt: skip
    add("--write-mode", choices=WRITE_MODES, default=env("PRAESTO_WRITE_MODE") or AgentSettings.write_mode,
        help="direct: O_DIRECT for large files on a local-disk store; buffered: through the page cache (default %(default)s)")  # fmt: skip
    add("--max-parallel-caches", type=int,
        default=env("PRAESTO_MAX_PARALLEL_CACHES") or str(AgentSettings.max_parallel_caches),
        help="caches downloading at once on this node (default %(default)s)")  # fmt: skip
    add("--reserve", default=env("PRAESTO_RESERVE") or None,
        help="disk kept free: a quantity (50Gi) or a percent (15%%); default the larger of 30Gi and 15%% of the disk")  # fmt: skip
    add("--metrics-port", type=int, default=env("PRAESTO_METRICS_PORT") or str(MetricsSettings.port),
        help="Prometheus /metrics port, 0 to disable (default %(default)s)")  # fmt: skip
    add(
        "--metrics-address",
        default=env("PRAESTO_METRICS_ADDRESS", MetricsSettings.address),
        help=argparse.SUPPRESS,
    )
    add("--metrics-from", choices=METRICS_FROM, default=env("PRAESTO_METRICS_FROM") or MetricsSettings.allowed_from,
        help="who may read /metrics (it names every tenant's caches): 'local', only inside the agent's "
        "Pod (kubectl port-forward, a sidecar); 'any', every client that reaches the port (the chart "
        "then admits only nodeAgent.metrics.allowedNamespaces with a NetworkPolicy). /healthz "
        "answers everyone (default %(default)s)")  # fmt: skip
    add(
        "--hf-endpoint",
        default=env(names.ENV_HF_ENDPOINT),
        help="Hugging Face endpoint or mirror (env HF_ENDPOINT)",
    )
    add(
        "--modelscope-endpoint",
        default=env(ENV_MODELSCOPE_ENDPOINT),
        help=f"ModelScope hub or mirror for ms:// sources (env {ENV_MODELSCOPE_ENDPOINT}; chart "
        "downloader.modelscopeEndpoint); unset: https://modelscope.cn",
    )
    add(
        "--ca-bundle",
        default=env(names.ENV_CA_BUNDLE),
        help="extra PEM CA bundle every download trusts besides the system roots "
        "(env PRAESTO_CA_BUNDLE; chart downloads.caBundle)",
    )
    add(
        "--egress-allowed-cidrs",
        default=env(names.ENV_EGRESS_ALLOWED_CIDRS, ""),
        help="comma-separated internal networks downloads may reach (e.g. 10.20.0.0/16 for an in-cluster "
        "mirror); loopback, link-local, metadata and private addresses are refused otherwise "
        f"(env {names.ENV_EGRESS_ALLOWED_CIDRS}; chart {egress.ALLOWED_SETTING})",
    )
    add(
        "--trust-dir",
        default=env(names.ENV_TRUST_DIR),
        help="the platform's signing trust, <name>.<publicKey|certificate>.pem files (env PRAESTO_TRUST_DIR; "
        "chart verification.trust)",
    )
    add(
        "--kubeconfig",
        default=env("KUBECONFIG"),
        help="kubeconfig for development; in-cluster config otherwise",
    )
    add("--log-format", choices=("json",), default="json", help=argparse.SUPPRESS)
    add("--startup-taint-key", default=env("PRAESTO_STARTUP_TAINT_KEY", StartupTaintSettings.key),
        help="taint this node may have joined with; lifted once its warmNewNodes caches are on disk "
        "(empty: never touch the Node) (default %(default)s)")  # fmt: skip
    add("--startup-taint-deadline", type=float,
        default=env("PRAESTO_STARTUP_TAINT_DEADLINE") or f"{StartupTaintSettings.deadline_seconds:g}",
        help="seconds after the Node's creation when the taint is lifted anyway, with Events (default %(default)s)")  # fmt: skip
    add("--warm-namespaces", type=credscope.split_list, default=env("PRAESTO_WARM_NAMESPACES", ""),
        help="comma-separated namespaces whose warmNewNodes caches may hold a new node's startup taint; "
        "none by default (chart nodeAgent.startupTaint.namespaces)")  # fmt: skip
    add("--scrub-interval", default=env("PRAESTO_SCRUB_INTERVAL") or names.DEFAULT_SCRUB_INTERVAL,
        help="re-hash each Ready copy this long after its last scrub, e.g. 168h; 0 disables (default %(default)s)")  # fmt: skip
    add("--scrub-bytes-per-second", default=env("PRAESTO_SCRUB_BYTES_PER_SECOND") or names.DEFAULT_SCRUB_BYTES_PER_SECOND,
        help="the scrub's read budget, a quantity, e.g. 64Mi (default %(default)s)")  # fmt: skip
    add_peer_arguments(parser, environ)
    add_budget_arguments(parser, environ)
    add_broker_arguments(parser, environ)


def check_arguments(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """The first problem with the flags (and the quotas variable in `env`), named with its fix, or None."""
    if args.modelscope_endpoint and not _http_url(args.modelscope_endpoint):
        return (
            f"--modelscope-endpoint {args.modelscope_endpoint!r} ({ENV_MODELSCOPE_ENDPOINT}) is not an http(s) "
            "URL; give the hub's base URL, e.g. https://modelscope.cn or a mirror's"
        )
    if not args.node_name:
        return (
            f"--node-name: Required value; set it or {names.ENV_NODE_NAME} "
            "(fieldRef spec.nodeName in the DaemonSet)"
        )
    if args.concurrency < 1 or args.max_parallel_caches < 1:
        return "--concurrency and --max-parallel-caches must be at least 1"
    if args.write_mode not in WRITE_MODES:  # argparse checks a flag's choices, not a variable's
        return (
            f"--write-mode (PRAESTO_WRITE_MODE): {args.write_mode!r} is not one of {', '.join(WRITE_MODES)}"
        )
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
        egress.parse_allowed(args.egress_allowed_cidrs)
    except ValueError as err:
        return f"--egress-allowed-cidrs ({names.ENV_EGRESS_ALLOWED_CIDRS}): {err}"
    try:
        capacity.check_reserve(args.reserve)
    except QuantityError as err:
        return f"--reserve: {err}; use e.g. 50Gi or 15%"
    try:
        _duration(args.scrub_interval)
    except (QuantityError, ValueError) as err:
        return f"--scrub-interval: {args.scrub_interval!r} is not a duration ({err}); use e.g. 168h, or 0 to disable"
    try:
        if parse_quantity(args.scrub_bytes_per_second) < 1:
            raise QuantityError("it must be positive")
    except (QuantityError, ValueError) as err:
        return f"--scrub-bytes-per-second: {args.scrub_bytes_per_second!r} ({err}); use e.g. 64Mi"
    try:
        quota.from_env(env)
    except quota.QuotaError as err:
        return f"{err} (env {quota.ENV})"
    return check_peer_arguments(args) or check_budget_arguments(args) or check_broker_arguments(args)


def _duration(text: str) -> float:
    """A scrub interval in seconds; "0" turns the scrub off."""
    return 0.0 if text.strip() in ("0", "0s", "") else float(parse_duration(text))


def _http_url(text: str) -> bool:
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.hostname)
