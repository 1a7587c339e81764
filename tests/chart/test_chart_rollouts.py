"""Upgrades roll what they change, and nothing else (issue 36 item 2).

The chart README's table ("Upgrades: what rolls") says, for each value a running process reads,
who reads it and whether a change needs a roll or arrives live. That table is the declaration and
this file the proof: each value it names is rendered before and after a change with the real
Helm engine, and the Pod templates that changed must be exactly those of its readers (none for a
live value). Rendering the same values again must change no Pod template, even where the chart
generates TLS material anew (offline, `lookup` finds no Secret to reuse). And the table is
complete: a value that reaches a process through another object its Pods use (a mounted ConfigMap
or Secret, the ServiceAccount) changes no Pod template by itself, so every value such an object is
made from (read from the template source, testkit/chart_values_refs.py) must be a row, or be in
NOT_READ_BY_A_PROCESS with why.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from helm_python import HelmError

from testkit.chart_values_refs import read_through_other_objects
from testkit.helm_chart import CHART_DIR, ROOT, deep_merge, find, one, render_objects

Obj = dict[str, Any]
README = CHART_DIR / "README.md"
SECTION = "## Upgrades: what rolls"
CHECKSUM_PREFIX = "checksum.praesto.io/"
# Which workload's Pod template each reader named in the table lives in.
WORKLOAD_OF = {
    "agent": "praesto-node-agent",
    "csi": "praesto-node-agent",
    "hooks": "praesto-hooks",
    "orphans": "praesto-orphans",
}
WORKLOAD_KINDS = ("DaemonSet", "Deployment")

PEM_KEY = "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n"
PEM_CERT = "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n"
ROLE = "arn:aws:iam::111122223333:role/{}"


def _identity(role: str) -> Obj:
    return {
        "credentials": {
            "namespaces": ["team-a"],
            "identity": {"serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": ROLE.format(role)}},
        }
    }


def _at(key: str, value: Any) -> Obj:
    """`a.b.c` = value, as nested values."""
    out: Any = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return dict(out)


# value -> (values before, the change): what each README row's value is changed from and to.
CHANGES: dict[str, tuple[Obj, Obj]] = {
    # The case: one role ARN for another left the DaemonSet byte-identical.
    "credentials.identity": (_identity("praesto-a"), _identity("praesto-b")),
    "credentials.secretRef.name": ({}, _at("credentials.secretRef.name", "praesto-credentials")),
    "credentials.namespaces": ({}, _at("credentials.namespaces", ["team-a"])),
    "credentials.sources": ({}, _at("credentials.sources", ["hf://my-org/"])),
    "verification.trust": (
        _at("verification.trust", {"platform": {"publicKey": PEM_KEY.format("AAAA")}}),
        _at("verification.trust", {"platform": {"publicKey": PEM_KEY.format("BBBB")}}),
    ),
    "nodeAgent.concurrency": ({}, _at("nodeAgent.concurrency", 4)),
    "nodeAgent.maxParallelCaches": ({}, _at("nodeAgent.maxParallelCaches", 3)),
    "nodeAgent.writeMode": ({}, _at("nodeAgent.writeMode", "buffered")),
    "nodeAgent.reserve": ({}, _at("nodeAgent.reserve", "50Gi")),
    "nodeAgent.logLevel": ({}, _at("nodeAgent.logLevel", "debug")),
    "nodeAgent.scrub.interval": ({}, _at("nodeAgent.scrub.interval", "24h")),
    "nodeAgent.startupTaint.deadlineSeconds": ({}, _at("nodeAgent.startupTaint.deadlineSeconds", 600)),
    "nodeAgent.peers.maxUploads": ({}, _at("nodeAgent.peers.maxUploads", 7)),
    "nodeAgent.metrics.allowedNamespaces": ({}, _at("nodeAgent.metrics.allowedNamespaces", ["monitoring"])),
    "nodeAgent.image.tag": ({}, _at("nodeAgent.image.tag", "9.9.9")),
    "originBudget.enabled": ({}, _at("originBudget.enabled", True)),
    "csi.kubeletDir": ({}, _at("csi.kubeletDir", "/var/lib/k0s/kubelet")),
    "csi.livenessProbe.port": ({}, _at("csi.livenessProbe.port", 9809)),
    "csi.image.tag": ({}, _at("csi.image.tag", "9.9.9")),
    "localCache.basePath": ({}, _at("localCache.basePath", "/mnt/models")),
    "hooks.workers": ({}, _at("hooks.workers", 3)),
    "hooks.logLevel": ({}, _at("hooks.logLevel", "debug")),
    "hooks.maxRequestBytes": ({}, _at("hooks.maxRequestBytes", 8388608)),
    "hooks.requestTimeoutSeconds": ({}, _at("hooks.requestTimeoutSeconds", 20)),
    "hooks.maxConnectionsPerClient": ({}, _at("hooks.maxConnectionsPerClient", 50)),
    "hooks.minBodyBytesPerSecond": ({}, _at("hooks.minBodyBytesPerSecond", 1048576)),
    "hooks.httpsPort": ({}, _at("hooks.httpsPort", 9443)),
    "hooks.orphans.resyncSeconds": ({}, _at("hooks.orphans.resyncSeconds", 300)),
    "hooks.orphans.logLevel": ({}, _at("hooks.orphans.logLevel", "debug")),
    "verification.requiredIn": ({}, _at("verification.requiredIn", ["prod"])),
    "downloader.image.tag": ({}, _at("downloader.image.tag", "9.9.9")),
    "downloader.allowedImages": ({}, _at("downloader.allowedImages", ["registry.example.com/praesto/*"])),
    "downloader.resources": ({}, _at("downloader.resources", {"requests": {"cpu": "1"}})),
    "downloader.backoffLimit": ({}, _at("downloader.backoffLimit", 2)),
    "downloader.activeDeadlineSeconds": ({}, _at("downloader.activeDeadlineSeconds", 3600)),
    "downloader.metadataEgress.deny": ({}, _at("downloader.metadataEgress.deny", False)),
    "image.tag": ({}, _at("image.tag", "9.9.9")),
    "namespaceQuota": ({}, _at("namespaceQuota.default", "500Gi")),
    "downloader.hfEndpoint": ({}, _at("downloader.hfEndpoint", "https://hf-mirror.example.com")),
    "downloader.modelscopeEndpoint": (
        {},
        _at("downloader.modelscopeEndpoint", "https://ms-mirror.example.com"),
    ),
    "downloads.proxy.httpsProxy": ({}, _at("downloads.proxy.httpsProxy", "http://proxy.example.com:3128")),
    "downloads.oci.mirrors": (
        {},
        _at("downloads.oci.mirrors", {"docker.io": ["https://mirror.example.com"]}),
    ),
    "downloads.caBundle.configMapName": ({}, _at("downloads.caBundle.configMapName", "corporate-ca")),
    "downloads.egress.allowedCIDRs": ({}, _at("downloads.egress.allowedCIDRs", ["10.20.0.0/16"])),
    "downloads.xet.enabled": ({}, _at("downloads.xet.enabled", True)),
    # Live: the hooks read these files at every TLS handshake (tests/hooks/test_hooks_tls_reload.py).
    "webhooks.clientAuth.caBundle": (
        _at("webhooks.clientAuth.caBundle", PEM_CERT.format("AAAA")),
        _at("webhooks.clientAuth.caBundle", PEM_CERT.format("BBBB")),
    ),
    "webhooks.certManager.duration": ({}, _at("webhooks.certManager.duration", "2160h")),
    "webhooks.certManager.renewBefore": ({}, _at("webhooks.certManager.renewBefore", "240h")),
    # The chart's Secret or cert-manager's, under one name: the Pod templates stay as they are.
    "webhooks.certManager.enabled": ({}, _at("webhooks.certManager.enabled", False)),
    "webhooks.selfSigned.validityDays": (
        _at("webhooks.certManager.enabled", False),
        _at("webhooks.selfSigned.validityDays", 365),
    ),
}


@dataclass(frozen=True)
class Row:
    values: tuple[str, ...]
    readers: frozenset[str]
    live: bool

    @property
    def rolls(self) -> set[str]:
        """The workloads whose Pod template a change must alter."""
        return set() if self.live else {WORKLOAD_OF[reader] for reader in self.readers}


def readme_rows() -> list[Row]:
    """The table of SECTION (up to the next section): `| values | read by | roll or live | how |`."""
    text = README.read_text()
    assert SECTION in text, f"{README}: no section {SECTION!r}"
    rows = []
    for line in text.split(SECTION, 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        readers = frozenset(r.strip() for r in cells[1].split(","))
        assert readers <= set(WORKLOAD_OF), f"README row {cells[0]}: unknown reader in {cells[1]!r}"
        assert cells[2] in ("roll", "live"), f"README row {cells[0]}: {cells[2]!r} is neither roll nor live"
        rows.append(Row(tuple(re.findall(r"`([^`]+)`", cells[0])), readers, cells[2] == "live"))
    return rows


ROWS = {value: row for row in readme_rows() for value in row.values}


@functools.cache
def _pod_templates(values_json: str) -> dict[str, Obj]:
    objects = render_objects(json.loads(values_json))
    return workload_templates(objects)


def workload_templates(objects: list[Obj]) -> dict[str, Obj]:
    """The Pod template of each workload rendered (name -> template)."""
    return {o["metadata"]["name"]: o["spec"]["template"] for o in objects if o["kind"] in WORKLOAD_KINDS}


def pod_templates(values: Obj) -> dict[str, Obj]:
    """The Pod template of each workload (name -> template), renders cached by values."""
    return _pod_templates(json.dumps(values, sort_keys=True))


def changed(before: Obj, after: Obj) -> set[str]:
    old, new = pod_templates(before), pod_templates(after)
    return {name for name in old if old[name] != new[name]}


def test_the_readme_table_and_these_changes_name_the_same_values() -> None:
    assert sorted(ROWS) == sorted(CHANGES), "a README row's value has no change here, or the reverse"


@pytest.mark.parametrize("value", sorted(CHANGES))
def test_a_change_rolls_exactly_its_readers(value: str) -> None:
    base, change = CHANGES[value]
    row = ROWS[value]
    assert changed(base, deep_merge(base, change)) == row.rolls, (
        f"{value}: the README says read by {sorted(row.readers)}, {'live' if row.live else 'roll'}"
    )


def test_a_new_role_reaches_the_agents_through_the_checksum_alone() -> None:
    """The issue's report: the DaemonSet's Pod template now differs, and only by the identity checksum."""
    base, change = CHANGES["credentials.identity"]
    old = pod_templates(base)[WORKLOAD_OF["agent"]]
    new = pod_templates(deep_merge(base, change))[WORKLOAD_OF["agent"]]
    assert old["spec"] == new["spec"]
    key = CHECKSUM_PREFIX + "identity"
    assert old["metadata"]["annotations"][key] != new["metadata"]["annotations"][key]


def test_checksums_only_where_the_input_is_set() -> None:
    """Defaults carry no checksum: turning an input on or off is itself a change that rolls."""
    for template in pod_templates({}).values():
        annotations = template["metadata"].get("annotations") or {}
        assert not [k for k in annotations if k.startswith(CHECKSUM_PREFIX)]


EVERYTHING = deep_merge(
    deep_merge(CHANGES["credentials.identity"][0], CHANGES["verification.trust"][0]),
    {
        "webhooks": {"certManager": {"enabled": False}, "clientAuth": {"caBundle": PEM_CERT.format("AAAA")}},
        "hooks": {"podAnnotations": {"example.com/team": "platform"}},
    },
)


def test_the_same_values_again_roll_nothing() -> None:
    """Two renders of one set of values (every checksummed input set, self-signed TLS generated anew by
    each offline render) give the same Pod templates; the hooks' own podAnnotations are kept."""
    first, second = (render_objects(EVERYTHING) for _ in range(2))
    tls = [one(objects, "Secret", "praesto-hooks-tls")["data"]["tls.crt"] for objects in (first, second)]
    assert tls[0] != tls[1], "offline renders generate new TLS material: the check below would prove nothing"
    assert set(workload_templates(first)) == set(WORKLOAD_OF.values())
    assert workload_templates(first) == workload_templates(second)
    hooks = one(first, "Deployment", WORKLOAD_OF["hooks"])["spec"]["template"]["metadata"]["annotations"]
    assert hooks["example.com/team"] == "platform" and CHECKSUM_PREFIX + "trust" in hooks
    agent = one(first, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert {CHECKSUM_PREFIX + "identity", CHECKSUM_PREFIX + "trust"} <= set(agent)


# --- values that reach a process through another object ------------------------------------------

# Values the objects a Pod uses are made from that no process can see, with why. Everything else
# such an object is made from must be a row of the README table.
NOT_READ_BY_A_PROCESS = {
    # Names and labels: no process reads the labels of the ConfigMap, Secret or ServiceAccount it
    # uses, and a renamed object is renamed in the Pod template that references it (which rolls).
    "nameOverride": "object names and the app.kubernetes.io/name label",
    "fullnameOverride": "object names",
}
# Renders that make each object a workload may use at least once (each exists only when set).
INPUT_RENDERS = (
    EVERYTHING,  # self-signed TLS, identity, trust, the webhook client CA
    deep_merge(EVERYTHING, _at("webhooks.certManager.enabled", True)),  # the Certificate, its Issuer
    deep_merge(
        _at("credentials.secretRef.name", "praesto-credentials"),
        _at("downloads.caBundle.configMapName", "corporate-ca"),
    ),
)


@functools.cache
def values_through_other_objects() -> dict[str, set[str]]:
    """Each value an object a workload uses is made from -> where it is read and by whom."""
    found: dict[str, set[str]] = {}
    for values in INPUT_RENDERS:
        for path, places in read_through_other_objects(values).items():
            found.setdefault(path, set()).update(places)
    return found


def _under(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == prefix or path.startswith(prefix + ".") for prefix in prefixes)


def test_values_reaching_a_process_through_another_object_are_in_the_table() -> None:
    """A value that reaches a process through a mounted ConfigMap or Secret, or its ServiceAccount,
    changes no Pod template by itself: the README table must say whether it rolls (and this file
    then proves it), or NOT_READ_BY_A_PROCESS why no process sees it."""
    found = values_through_other_objects()
    missing = sorted(path for path in found if not _under(path, [*ROWS, *NOT_READ_BY_A_PROCESS]))
    assert not missing, "\n".join(
        f"{path} is read at {min(found[path], key=len)} (and {len(found[path]) - 1} more places): add it "
        f"to {README.relative_to(ROOT)} {SECTION!r} (roll or live) or to NOT_READ_BY_A_PROCESS saying why no "
        "process sees it"
        for path in missing
    )


def test_the_inputs_check_sees_the_inputs_it_is_for() -> None:
    """Not vacuous: it finds the inputs that motivated it, and the allow-list holds nothing stale."""
    found = values_through_other_objects()
    known = {
        "credentials.identity.serviceAccountAnnotations",  # the agent's ServiceAccount
        "verification.trust",  # the trust ConfigMap
        "webhooks.clientAuth.caBundle",  # the hooks' client-CA ConfigMap
        "webhooks.certManager.duration",  # the Certificate that writes the hooks' TLS Secret
        "webhooks.selfSigned.validityDays",  # the chart-made TLS Secret
    }
    assert known <= set(found)
    assert set(NOT_READ_BY_A_PROCESS) <= set(found), "an allow-listed value no longer reaches any process"


# --- nodeAgent.updateStrategy ---------------------------------------------------------------------


def update_strategy(values: Obj) -> Obj:
    strategy: Obj = one(render_objects(values), "DaemonSet")["spec"]["updateStrategy"]
    return strategy


def test_the_default_rolls_a_tenth_of_the_nodes_at_a_time_without_surge() -> None:
    assert update_strategy({}) == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "10%", "maxSurge": 0},
    }


def test_update_strategy_is_configurable() -> None:
    five = update_strategy(_at("nodeAgent.updateStrategy.rollingUpdate.maxUnavailable", 5))
    assert five["rollingUpdate"] == {"maxUnavailable": 5, "maxSurge": 0}
    assert update_strategy(_at("nodeAgent.updateStrategy.type", "OnDelete")) == {"type": "OnDelete"}
    zero_surge = update_strategy(_at("nodeAgent.updateStrategy.rollingUpdate.maxSurge", 0))
    assert zero_surge["rollingUpdate"]["maxSurge"] == 0


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (_at("nodeAgent.updateStrategy.rollingUpdate.maxSurge", 1), "maxSurge is 1: a second agent Pod"),
        (_at("nodeAgent.updateStrategy.rollingUpdate.maxSurge", "25%"), "remove maxSurge"),
        (_at("nodeAgent.updateStrategy.rollingUpdate.maxUnavailable", 0), "maxUnavailable"),
        (_at("nodeAgent.updateStrategy.rollingUpdate.maxUnavailable", "0%"), "maxUnavailable"),
        (_at("nodeAgent.updateStrategy.type", "Recreate"), "/nodeAgent/updateStrategy/type"),
    ],
)
def test_an_update_strategy_that_would_break_a_node_is_refused(values: Obj, says: str) -> None:
    with pytest.raises(HelmError, match=re.escape(says)):
        render_objects(values)


def test_a_pvc_only_install_has_no_daemonset_to_roll() -> None:
    assert not find(render_objects(_at("nodeAgent.enabled", False)), "DaemonSet")
