"""The user guide's troubleshooting table explains every reason the code can set, and only those.

The reasons are found by reading the code (testkit/reason_scan.py), plus the ones Kubernetes
sets and the hooks pass through unchanged: the kubelet's waiting reasons of the PVC-mode
download Pod (hooks/pvc_pod.py) and the Job controller's failure reasons (hooks/pvc_job.py,
found by the scan as a `*REASONS` constant).
"""

from __future__ import annotations

import re
from functools import cache

from praesto.hooks import pvc_pod

from testkit.helm_chart import ROOT
from testkit.reason_scan import scan

GUIDE = ROOT / "docs" / "user-guide.md"
CODE_DIRS = ("praesto", "hooks", "agent", "csi")  # what ships: the wheel's packages
SECTION = "## Troubleshooting by condition reason"
# What the issue (36) names, and one reason reached by each way the scan follows a value.
KNOWN = {
    "Pending": "a constant named REASON_*",
    "Creating": "a tuple element returned where a caller unpacks a reason",
    "VolumeLost": "a tuple assignment `phase, reason = ...`",
    "Deleting": "a positional argument at a parameter named reason",
    "UnusedTTLExpired": "a tuple assignment `phase, reason = ...`",
    "BackoffLimitExceeded": "a frozenset constant named *REASONS",
    "WaitingForServiceAccount": "a local tuple later unpacked into a reason",
    "ReadyOnHealthyNodes": "a branch of `a if c else b` bound to a reason",
    "JobFailed": "the `or` default of a reason",
    "RepoNotFound": "a tuple constant named REASONS",
    "ServiceUnavailable": "a dict constant named *REASONS",
    "Invalid": 'a `"reason":` dict value',
    "ModelCacheMiss": "a constant returned where a caller unpacks a reason",
}


@cache
def code_reasons() -> dict[str, set[str]]:
    files = [p for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    found = {reason: set(places) for reason, places in scan(files, ROOT).items()}
    for reason in pvc_pod.CONFIG_ERRORS | pvc_pod.IMAGE_ERRORS:
        found.setdefault(reason, set()).add("hooks/pvc_pod.py (the kubelet's, passed through)")
    return found


def table_rows() -> dict[str, str]:
    """reason -> its row's explanation, from the first column's `code` spans."""
    text = GUIDE.read_text()
    assert SECTION in text, f"docs/user-guide.md lost its section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or set(cells[0]) <= {"-"} or cells[0] == "reason":
            continue
        for reason in re.findall(r"`([^`]+)`", cells[0]):
            assert reason not in rows, f"{reason} has two rows in the troubleshooting table"
            rows[reason] = cells[-1]
    return rows


def test_the_scan_still_finds_every_kind_of_reason() -> None:
    """Without this, a scan that went blind would make the next test pass on nothing."""
    found = code_reasons()
    missing = {reason: how for reason, how in KNOWN.items() if reason not in found}
    assert not missing, f"the reason scan (testkit/reason_scan.py) no longer finds: {missing}"


def test_every_reason_the_code_sets_is_explained() -> None:
    rows = table_rows()
    missing = {reason: sorted(places) for reason, places in code_reasons().items() if reason not in rows}
    assert not missing, (
        "reasons the code can set that docs/user-guide.md's troubleshooting table does not explain "
        f"(add a row: what it means, what to do): {missing}"
    )


def test_every_row_is_a_reason_the_code_sets() -> None:
    stale = sorted(set(table_rows()) - set(code_reasons()))
    assert not stale, f"the troubleshooting table explains reasons the code no longer sets: {stale}"


def test_every_row_says_what_to_do() -> None:
    empty = sorted(reason for reason, text in table_rows().items() if len(text.split()) < 5)
    assert not empty, f"troubleshooting rows without an explanation: {empty}"
