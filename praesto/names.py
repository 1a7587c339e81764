"""Every name, label, annotation and constant the parts agree on.

One source of truth: the hooks, the webhook, the agent, the CSI driver, the
chart tests and the docs import from here.
"""

from __future__ import annotations

import hashlib
import re

GROUP = "praesto.praesto.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

MODELCACHE_KIND = "ModelCache"
MODELCACHE_PLURAL = "modelcaches"
MODELCACHENODE_KIND = "ModelCacheNode"
MODELCACHENODE_PLURAL = "modelcachenodes"
# One per Node, cluster-scoped, named as the Node: the labels ModelCache selectors read, written by the
# node decorator (hooks/node_summary.py) so a cache's sync relates these instead of whole Nodes.
NODESUMMARY_KIND = "NodeSummary"
NODESUMMARY_PLURAL = "nodesummaries"

CSI_DRIVER_NAME = "csi.praesto.io"
CSI_ATTR_CACHE_NAME = "modelCacheName"
CSI_ATTR_LEGACY_NAMESPACE = "modelCacheNamespace"
CSI_ATTR_POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
CSI_ATTR_POD_NAME = "csi.storage.k8s.io/pod.name"
CSI_ATTR_POD_UID = "csi.storage.k8s.io/pod.uid"
CSI_ATTR_EPHEMERAL = "csi.storage.k8s.io/ephemeral"

# Labels and annotations
LABEL_NODE = "praesto.io/node"
LABEL_MODEL_CACHE = "praesto.io/model-cache"
LABEL_CACHE_NODE = "praesto.io/cache-node"
LABEL_USES_MODEL_CACHE = "praesto.io/uses-model-cache"
LABEL_INJECTION = "praesto.io/model-cache-injection"
INJECTION_ENABLED = "enabled"
CONSUMER_LABEL_PREFIX = "consumer.praesto.io/"
READY_LABEL_PREFIX = "ready.praesto.io/"
# On a Node once its NodeSummary exists (the decorator saw it): caches stop relating that Node whole.
LABEL_NODE_SUMMARIZED = "praesto.io/node-summary"
# Node labels a NodeSummary does not copy (hooks/node_summary.py): node-feature-discovery's, under this
# domain or a subdomain of it (~80 on a GPU node; a summary stores each label three times: labels,
# last-applied annotation, managedFields), those that change by themselves (a write each would be
# a pass of every cache selecting the node), and our own, which change with every copy's readiness.
# A nodeSelector naming one makes its cache relate whole Nodes, as before summaries.
NFD_LABEL_DOMAIN = "feature.node.kubernetes.io"
# Labels that change with no change to the node: GPU feature discovery stamps each relabelling run.
VOLATILE_NODE_LABELS = frozenset({"nvidia.com/gfd.timestamp"})
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "praesto"

ANNOTATION_MODEL_MOUNTS = "praesto.io/model-mounts"
ANNOTATION_TARGET_CONTAINER = "praesto.io/target-container"
ANNOTATION_LEGACY_MODEL_CACHE = "praesto.io/model-cache"
ANNOTATION_LEGACY_MOUNT_PATH = "praesto.io/model-mount-path"
ANNOTATION_SCHEDULING = "praesto.io/scheduling"
# On a PVC-mode download Pod: the platform's trust PEM its cache names (spec.verification ...clusterTrust)
ANNOTATION_SIGNATURE_TRUST = "praesto.io/signature-trust"
DEFAULT_MOUNT_PATH = "/models"

FINALIZER_NODE_AGENT = "praesto.io/node-agent"
# The taint a node joins with until its warmNewNodes caches are on disk (agent/startup_taint.py);
# the chart's nodeAgent.startupTaint.key defaults to it.
DEFAULT_STARTUP_TAINT_KEY = "praesto.io/warming"
# Reason the agent records (ModelCacheNode status.startupTaint) when the deadline lifted the taint
# before the copy was Ready; the sync hook turns it into the WarmBeforeSchedulable condition.
REASON_WARM_DEADLINE = "WarmDeadlineExceeded"
CONDITION_WARM_BEFORE_SCHEDULABLE = "WarmBeforeSchedulable"

# Phases
PHASE_PENDING = "Pending"
PHASE_DOWNLOADING = "Downloading"
PHASE_READY = "Ready"
PHASE_FAILED = "Failed"
PHASE_EVICTED = "Evicted"
PHASES = (PHASE_PENDING, PHASE_DOWNLOADING, PHASE_READY, PHASE_FAILED, PHASE_EVICTED)
MODE_NODE = "Node"
MODE_PVC = "PVC"

# Node-local store marker files (see praesto.store for the layout)
OWNER_FILE = ".praesto-owner"
MANIFEST_FILE = ".praesto-manifest.json"
COMPLETE_FILE = ".praesto-complete"
MARKER_FILES = (OWNER_FILE, MANIFEST_FILE, COMPLETE_FILE)
# The manifest's key for the UID of the ModelCache a copy was downloaded for (the agent's copies;
# a pre-baked copy from `praesto-agent download` has none): a cache re-created under the same name
# never inherits the old one's copy (#21 item 9).
MANIFEST_CACHE_UID = "cacheUID"
# The manifest's key for how a signed model was verified (method, signer, trust fingerprint); absent
# when the cache asked for no signature (agent/download/signature.py).
MANIFEST_SIGNATURE = "signature"
# In that record: the files of the source the signature does not cover (git paths, the signer's
# ignore_paths), removed before publication: a signed copy holds exactly the signed files.
MANIFEST_SIGNATURE_EXCLUDED = "excluded"
# The manifest's key for the OCI archive layers a copy's files were unpacked from (path, size,
# digest, kind); absent for every other source (agent/download/unpack.py).
MANIFEST_LAYERS = "layers"
# An OCI registry credential: the key of a kubernetes.io/dockerconfigjson Secret (a Docker config
# file's JSON), also the file name when such a Secret is mounted for the PVC-mode downloader.
DOCKER_CONFIG_KEY = ".dockerconfigjson"
# Where a signed model keeps its OpenSSF model-signing bundle, relative to the model's root: the
# model-signing library's own default (`model_signing sign --signature`, src/model_signing/_cli.py).
DEFAULT_SIGNATURE_FILE = "model.sig"
# A copy's (and, when every failed copy says so, the ModelCache's) Ready reason when the model's
# required signature is missing, invalid or does not match its files.
REASON_SIGNATURE_INVALID = "SignatureInvalid"

DEFAULT_BASE_PATH = "/var/praesto"
DEFAULT_REVISION = "main"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def is_dns_label(value: str) -> bool:
    """RFC 1123 label: what a namespace or ModelCache name must be."""
    return len(value) <= 63 and bool(_DNS_LABEL.match(value))


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(_LABEL_VALUE.match(value))


def short_hash(text: str, length: int = 16) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def ready_label_key(namespace: str, name: str) -> str:
    """Node label marking a warm node for one cache, without leaking tenant names.

    Cluster-scoped Node objects are readable by many; the key is a hash of
    `<namespace>/<name>` so it is valid for every legal name and reveals neither.
    """
    return READY_LABEL_PREFIX + short_hash(f"{namespace}/{name}")


def consumer_label_key(cache_name: str) -> str:
    """Pod label the mutating webhook sets and the customize hook selects on."""
    return CONSUMER_LABEL_PREFIX + cache_name


def node_label_value(node_name: str) -> str:
    """Value of `praesto.io/node` for a node.

    Node names may be DNS subdomains up to 253 characters; label values stop
    at 63. Short names are used as they are; longer ones become a readable
    prefix plus a hash, computed the same way by the hooks and the agent.
    """
    if is_label_value(node_name):
        return node_name
    digest = short_hash(node_name, 10)
    prefix = re.sub(r"[^A-Za-z0-9_.-]", "-", node_name)[:50].strip("-_.")
    return f"{prefix}-{digest}" if prefix else f"n-{digest}"


def modelcachenode_name(cache_name: str, node_name: str) -> str:
    """Deterministic, valid, unique ModelCacheNode name for (cache, node).

    `<cache>-<node>` cut to fit 63 characters, then a hash of both, so two long
    node (or cache) names sharing a prefix never collide.
    """
    digest = short_hash(f"{cache_name}/{node_name}", 8)
    node_part = re.sub(r"[^a-z0-9-]", "-", node_name.lower())
    head = f"{cache_name}-{node_part}"[: 63 - len(digest) - 1].strip("-")
    return f"{head}-{digest}"


def _bounded_name(prefix: str, cache_name: str) -> str:
    """`<prefix><cache>` kept within 63 characters (Job names become label values)."""
    name = prefix + cache_name
    if len(name) <= 63:
        return name
    digest = short_hash(cache_name, 8)
    return f"{name[: 63 - len(digest) - 1].rstrip('-')}-{digest}"


def pvc_name(cache_name: str) -> str:
    return _bounded_name("praesto-", cache_name)


def download_job_name(cache_name: str) -> str:
    return _bounded_name("praesto-download-", cache_name)


def secret_reader_role_name(cache_name: str) -> str:
    return _bounded_name("praesto-secret-reader-", cache_name)


def trust_reader_role_name(cache_name: str) -> str:
    """The agent's following of a cache's trust Secret or ConfigMap (hooks/local.py trust_watch_grant)."""
    return _bounded_name("praesto-trust-reader-", cache_name)


def download_progress_role_name(cache_name: str) -> str:
    """The Role (and RoleBinding) letting a PVC-mode download Pod write its Job's progress annotation."""
    return _bounded_name("praesto-download-progress-", cache_name)


# Peers (agent/peers/auth.py, identity.py): every peer token is minted for one target node's
# audience and the key that signs its requests, `peer_audience(node)` + "/<key id>"
# (agent/peers/protocol.py `audience`); the TokenReview extras the API server adds to a Pod-bound
# token name the Pod's node, name and UID.
PEER_TOKEN_AUDIENCE = "praesto-peer"  # noqa: S105 - an audience name, not a secret
TOKEN_EXTRA_NODE_NAME = "authentication.kubernetes.io/node-name"  # noqa: S105 - a key name
TOKEN_EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"  # noqa: S105 - a key name
TOKEN_EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"  # noqa: S105 - a key name


def peer_audience(node: str) -> str:
    """The audience prefix of peer tokens meant for the agent on `node`: no other node accepts them."""
    return f"{PEER_TOKEN_AUDIENCE}/{node}"


# The credentials broker (hooks/broker.py, served by praesto-hooks): an agent asks it for one object a
# copy on its node names (spec.source.secretRef, spec.verification's Secret or ConfigMap) with a token
# of its own Pod minted for this audience; the broker reads the node from the TokenReview.
BROKER_TOKEN_AUDIENCE = "praesto-broker"  # noqa: S105 - an audience name, not a secret
BROKER_PATH = "/broker/v1/objects"
BROKER_MAX_OBJECT_BYTES = 1 << 20  # a Secret or ConfigMap's data as the broker hands it out, at most


# Environment variables of the downloader (the DaemonSet and the PVC-mode Job set them; each
# process takes them once, at its edge: agent/cli.py main -> download/settings.py, agent/settings.py).
ENV_HF_ENDPOINT = "HF_ENDPOINT"  # the Hugging Face endpoint or mirror
ENV_MODELSCOPE_ENDPOINT = "MODELSCOPE_ENDPOINT"  # the ModelScope endpoint or mirror (its client's own name)
ENV_HF_TOKEN = "HF_TOKEN"  # noqa: S105 - a variable's name: the Hub token (PVC Job: from the cache's Secret)
# ModelScope's token variable, the name its own client reads (modelscope_hub 0.5.1 config.py ENV_TOKEN)
# and the PVC Job sets from the cache's Secret (praesto/kinds.py).
ENV_MODELSCOPE_TOKEN = "MODELSCOPE_API_TOKEN"  # noqa: S105 - a variable's name
ENV_CA_BUNDLE = "PRAESTO_CA_BUNDLE"  # extra PEM CA bundle every download trusts (downloads.caBundle)
ENV_TERMINATION_LOG = "PRAESTO_TERMINATION_LOG"  # the PVC-mode Job's result file (hooks/pvc_pod.py)
# PVC mode's live progress (hooks/pvc_progress.py, agent/download/job_progress.py): the download Pod
# patches this one annotation on its own Job (`namespace/name` in the env variable), authenticated by
# a projected token for the Job's ServiceAccount in PROGRESS_CREDENTIALS_DIR (files `token`, `ca.crt`).
ANNOTATION_DOWNLOAD_PROGRESS = "praesto.io/progress"
ENV_PROGRESS_JOB = "PRAESTO_PROGRESS_JOB"
PROGRESS_CREDENTIALS_DIR = "/var/run/secrets/praesto/progress"
ENV_CREDENTIALS_DIR = "PRAESTO_CREDENTIALS_DIR"  # a mounted object-store credentials Secret
# OCI registry mirrors, JSON {"registry host": ["https://mirror[:port]", ...]} (downloads.oci.mirrors):
# tried in order before the registry itself, like containerd's hosts.toml mirrors.
ENV_OCI_MIRRORS = "PRAESTO_OCI_MIRRORS"
# Networks a download may reach although internal (chart downloads.egress.allowedCIDRs; comma-separated
# CIDRs): agent/download/egress.py refuses loopback, link-local, metadata and private addresses otherwise.
ENV_EGRESS_ALLOWED_CIDRS = "PRAESTO_EGRESS_ALLOWED_CIDRS"
# Hugging Face files stored in Xet are fetched through the Xet CAS (agent/download/origins/huggingface/xetpath.py) when
# this is "true" (chart downloads.xet.enabled, --xet); anything else: whole through resolve/.
ENV_XET = "PRAESTO_XET"
# The platform's signing trust (chart verification.trust): the mounted ConfigMap's directory, read
# by the hooks and the node agent at start; and the namespaces that accept only signed models
# (verification.requiredIn, comma-separated, "*": all). praesto/trustpolicy.py.
ENV_TRUST_DIR = "PRAESTO_TRUST_DIR"
ENV_SIGNATURE_REQUIRED_IN = "PRAESTO_SIGNATURE_REQUIRED_IN"
# This node's name (downward API spec.nodeName): the agent's and the CSI plugin's --node-name
ENV_NODE_NAME = "NODE_NAME"
# praesto-agent's --log-level (agent/cli.py, every subcommand; agent/settings.py keeps it)
ENV_LOG_LEVEL = "PRAESTO_LOG_LEVEL"
DEFAULT_LOG_LEVEL = "INFO"

# `praesto-agent download` exit code for SizeExceedsRequest; the PVC-mode Job's podFailurePolicy
# fails the Job on it at once and the sync hook reports it (issue 7).
DOWNLOAD_EXIT_TOO_LARGE = 3
# ... and for SignatureInvalid (spec.verification): retrying the same bytes cannot help either.
DOWNLOAD_EXIT_SIGNATURE_INVALID = 4

# Cluster-wide origin budget (agent/budget): Leases in the release namespace. Each node claims a
# place in a group's queue with a Lease of its own, `praesto-origin-<group>.<node>` (<group>: `all`
# for maxNodes, `h<hash>` per source for perHost), and a Lease per source carries the shared
# Retry-After (`praesto-origin-host-<hash>`, no holder). The chart's policy lets the agent write
# only Leases with this prefix, only its own claims, with bounded durations and Retry-After.
ORIGIN_LEASE_PREFIX = "praesto-origin-"
LABEL_ORIGIN_BUDGET = "praesto.io/origin-budget"  # value: "claim" or "host"
ORIGIN_CLAIM, ORIGIN_HOST = "claim", "host"
# The resourceVersion of the write that made a claim (its place in the queue, set on the first
# renewal; until then the claim's own resourceVersion is it). The policy admits only that value.
ANNOTATION_CLAIMED_AT = "praesto.io/claimed-at-resource-version"
# A claim that pulls from the origin: "new" on the write that marks it, then the resourceVersion
# of that write (recorded on the next one; the policy admits only that value). Pullers are
# ordered by it, and only the first `count` may pull: the budget's safety rests on this order.
ANNOTATION_PULLING_SINCE = "praesto.io/pulling-since-resource-version"
PULLING_NEW = "new"
ANNOTATION_ORIGIN_NAMESPACE = "praesto.io/origin-namespace"  # whose download a claim queues for
ANNOTATION_ORIGIN_HOST = "praesto.io/origin-host"
ANNOTATION_RETRY_AFTER_UNTIL = "praesto.io/retry-after-until"  # RFC 3339: no origin request before
ANNOTATION_RETRY_AFTER_BY = "praesto.io/retry-after-by"  # the node that was told to wait
REASON_WAITING_FOR_ORIGIN_BUDGET = "WaitingForOriginBudget"

# At-rest scrub (issue #25 part 2, agent/scrub/): the agent re-hashes each Ready copy against its manifest.
REASON_SCRUB_MISMATCH = "ScrubMismatch"  # Warning Event; the copy's reason while it is repaired
REASON_SCRUB_REPAIRED = "ScrubRepaired"  # Normal Event once the bad files were fetched again
REASON_SCRUB_REPAIR_FAILED = "ScrubRepairFailed"  # the copy's Failed reason: a file could not be repaired
SCRUB_CLEAN = "Clean"  # status.scrub.result values
SCRUB_REPAIRED = "Repaired"
SCRUB_FAILED = "Failed"
# The progress message (what a new mount is told, csi/waiting.py) while a copy is repaired.
SCRUB_REPAIR_PROGRESS = "the at-rest scrub found bad files, new mounts wait while they are fetched again"
SCRUB_MISMATCHED_MAX = 10  # status.scrub.mismatched lists at most this many paths
DEFAULT_SCRUB_INTERVAL = "168h"  # chart nodeAgent.scrub.interval; "0" disables
DEFAULT_SCRUB_BYTES_PER_SECOND = "64Mi"  # chart nodeAgent.scrub.bytesPerSecond

# ---- rolling revision updates (issue #25 part 1) ----
# spec.updateStrategy.switch: when a node that holds the new revision beside the old one starts
# serving it to new Pods: at once (each node on its own), or only once every selected node holds it.
SWITCH_EACH_NODE = "EachNode"
SWITCH_ALL_NODES = "AllNodes"
SWITCH_POLICIES = (SWITCH_EACH_NODE, SWITCH_ALL_NODES)
DEFAULT_SWITCH_POLICY = SWITCH_EACH_NODE
# The ModelCache condition while some selected node does not serve the target revision yet, and
# its reasons; the Normal Event a node's switch records on its ModelCacheNode.
CONDITION_ROLLING = "Rolling"
REASON_ROLLING = "RevisionRolling"
REASON_ROLLED = "RevisionRolled"
REASON_REVISION_SWITCHED = "RevisionSwitched"
# ModelCacheNode status.next.phase: the copy beside the served one
NEXT_DOWNLOADING = "Downloading"
NEXT_READY = "Ready"
# Store: the copy fetched beside the served one, and copies a switch retired (kept while mounted)
STORE_NEXT_DIR = "next"
STORE_RETIRED_DIR = "retired"
