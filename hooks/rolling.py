"""Rolling revision updates across the selected nodes (issue #25 part 1): pure, from the request.

A source's version may change (the Hub revision, an OCI tag or digest, an object store's prefix
within its bucket: `Source.version`). Each node agent then
fetches the new revision beside the copy it serves and switches when its ModelCacheNode's `spec.switch` allows
(agent/rolling.py). This module decides, from the parent's previous status and the copies'
reports, which commit the spec's revision resolves to (the target), what each node is told
(the target, pinned once known, or its old source while `maxFetching` nodes fetch already;
`switch` per the policy) and what the cache's status says (the revision served and the next
one, ready counts per revision, the `Rolling` condition).

Why the previous status is read: a branch or tag is resolved by the first node that fetches it,
and its commit must then be pinned on every node (they must all hold the same bytes). The
commit, with the spec revision it answers (`status.requestedRevision`), is kept in the status
written in the same pass as the pinned children, so no pass waits for another (issue 22).

Object stores have no commit to pin: each node lists the prefix itself, and its listing digest
(resolvedRevision) is its own. Their copies are told apart by the version they answer (the
`bucket/prefix` each copy reports as status.revision), so a listing that changed between two
nodes' fetches cannot leave a roll unable to finish; the cache's resolvedRevision still shows
a listing digest of the served prefix.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from praesto.hooks.common import Obj, section
from praesto.hooks.views import Copy

from praesto import names
from praesto.kinds import ROLLS_PREFIX
from praesto.spec import ModelCacheSpec, parse_uri


@dataclass(frozen=True)
class NodeRoll:
    """What one node is told: the source version to hold and whether to serve it once held."""

    revision: str
    switch: bool = True


@dataclass
class Rollout:
    target: str  # the commit the spec's revision resolves to ("" until a node resolved it)
    current: str  # the commit served: the old one until every selected node serves the target
    requested: str  # the spec revision `target` (else `current`) answers
    resolved: str = ""  # status.resolvedRevision: `current`, or for object stores its listing digest
    nodes: dict[str, NodeRoll] = field(default_factory=dict)
    serving: int = 0  # selected nodes serving the target
    holding: int = 0  # selected nodes holding it beside their served copy
    fetching: int = 0
    revisions: list[Obj] = field(default_factory=list)  # [{revision, readyNodes}]

    @property
    def rolling(self) -> bool:
        return bool(self.current) and self.target != self.current


def _next(status: Mapping[str, Any]) -> Mapping[str, Any]:
    return section(status, "next")


@dataclass(frozen=True)
class _Keys:
    """How a node's copies are named in a rollout: by commit (status resolvedRevision) for sources
    that resolve, by version (status revision: `bucket/prefix`) for object stores."""

    by_version: bool

    @property
    def field(self) -> str:
        return "revision" if self.by_version else "resolvedRevision"

    def served(self, status: Mapping[str, Any]) -> str:
        """What a node serves, "" unless its copy is Ready."""
        value = status.get(self.field)
        return value if status.get("phase") == names.PHASE_READY and isinstance(value, str) else ""

    def held(self, status: Mapping[str, Any]) -> str:
        """What a node holds beside the served copy, ready to switch to ("" if nothing)."""
        beside = _next(status)
        value = beside.get(self.field)
        return value if beside.get("phase") == names.NEXT_READY and isinstance(value, str) else ""


def _keys(spec: ModelCacheSpec) -> _Keys:
    return _Keys(spec.source.kind.rolls == ROLLS_PREFIX)


def _majority(counts: Counter[str]) -> str:
    return min(counts, key=lambda r: (-counts[r], r)) if counts else ""


def told_version(child_source: Mapping[str, Any]) -> str:
    """The version a ModelCacheNode's resolved source names (its uri's prefix for object stores)."""
    uri = child_source.get("uri")
    parsed = parse_uri(uri)[0] if isinstance(uri, str) else None
    if parsed is not None and parsed.kind.rolls == ROLLS_PREFIX:
        return parsed.version
    return str(child_source.get("revision") or "")


def target_revision(
    spec: ModelCacheSpec,
    before: Mapping[str, Any],
    statuses: Mapping[str, Mapping[str, Any]],
    told: Mapping[str, str],
) -> tuple[str, str]:
    """(target commit or "", the spec revision the previous status's commits answered).

    A status from before rolling updates has no requestedRevision: the spec was immutable then,
    so it answers the spec's revision. `told` is each node's observed child's source revision.
    """
    source = spec.source
    wanted = source.version
    answered = before.get("requestedRevision")
    answered = answered if isinstance(answered, str) and answered else wanted
    if source.kind.rolls == ROLLS_PREFIX:
        return wanted, answered  # a prefix names itself: nothing to resolve, nothing to pin
    if not source.resolves:
        return "", answered
    if source.is_pin(wanted):
        return wanted, answered
    known = before.get("nextRevision") or before.get("resolvedRevision")
    if answered == wanted and isinstance(known, str) and known:
        return known, answered
    old = before.get("resolvedRevision") if answered != wanted else None
    votes: Counter[str] = Counter()
    for node, status in statuses.items():
        beside = _next(status)
        if beside.get("revision") == wanted and source.is_pin(str(beside.get("resolvedRevision") or "")):
            votes[str(beside["resolvedRevision"])] += 1
        elif not beside and _answers(status, wanted, told.get(node), old):
            revision = status.get("resolvedRevision")
            fetched = status.get("phase") in (names.PHASE_READY, names.PHASE_DOWNLOADING)
            if isinstance(revision, str) and source.is_pin(revision) and revision != old and fetched:
                votes[revision] += 1
    if not votes:
        return "", answered
    return min(votes, key=lambda r: (-votes[r], r)), answered


def _answers(status: Mapping[str, Any], wanted: str, told: str | None, old: Any) -> bool:
    """Whether a copy's resolvedRevision is what `wanted` resolves to. The copy says which spec
    revision it answers (status.revision); without it (an agent from before that field), a node
    told the branch that reports a commit resolved it, unless it is the old copy it served before
    it reacted. That guess once pinned a branch changed right after the first download to the
    old commit (the cache's status lagged its nodes, so the old commit was not known yet)."""
    reported = status.get("revision")
    if isinstance(reported, str) and reported:
        return reported == wanted
    return told == wanted or not old


def plan(
    spec: ModelCacheSpec,
    before: Mapping[str, Any],
    node_names: Sequence[str],
    copies: Sequence[Copy],
) -> Rollout:
    """The rollout for this pass (the sync hook plans once and passes it on): the target, the served
    commit, what each node is told."""
    statuses: dict[str, Mapping[str, Any]] = {}
    told: dict[str, str] = {}
    for copy in copies:
        if copy.node is not None:
            statuses[copy.node] = copy.status
            told[copy.node] = told_version(copy.source)
    target, answered = target_revision(spec, before, statuses, told)
    keys = _keys(spec)
    selected = [statuses.get(n, {}) for n in node_names]
    serving = sum(1 for s in selected if target and keys.served(s) == target)
    holding = sum(1 for s in selected if target and keys.held(s) == target)
    current = _current(keys, before, selected, target)
    if target and node_names and serving == len(node_names):
        current = target  # every selected node serves it: the roll is over
    requested = spec.source.version if target else answered
    out = Rollout(target, current, requested, serving=serving, holding=holding)
    out.resolved = _resolved(keys, before, selected, current)
    if not out.rolling:
        out.nodes = {n: NodeRoll(target or spec.source.version) for n in node_names}
        out.revisions = _ready_counts(keys, selected, target)
        return out
    _tell_nodes(out, spec, node_names, statuses, told)
    out.revisions = _ready_counts(keys, selected, target)
    return out


def _current(
    keys: _Keys, before: Mapping[str, Any], selected: Sequence[Mapping[str, Any]], target: str
) -> str:
    """What the cache serves: the previous status's commit; for object stores (and while the
    cache's status lags its nodes) what most nodes serve, another version than the target first."""
    if keys.by_version:
        others = Counter(keys.served(s) for s in selected if keys.served(s) not in ("", target))
        return _majority(others) or target
    previous = before.get("resolvedRevision")
    if isinstance(previous, str) and previous:
        return previous
    return _majority(Counter(keys.served(s) for s in selected if keys.served(s))) or target


def _resolved(
    keys: _Keys, before: Mapping[str, Any], selected: Sequence[Mapping[str, Any]], current: str
) -> str:
    """status.resolvedRevision: the served commit, or the listing digest most nodes serving the
    current object-store version hold (the previous one while none is Ready)."""
    if not keys.by_version:
        return current
    digests = Counter(
        str(s.get("resolvedRevision"))
        for s in selected
        if keys.served(s) == current and s.get("resolvedRevision")
    )
    previous = before.get("resolvedRevision")
    return _majority(digests) or (previous if isinstance(previous, str) else "")


def _tell_nodes(
    out: Rollout,
    spec: ModelCacheSpec,
    node_names: Sequence[str],
    statuses: Mapping[str, Mapping[str, Any]],
    told: Mapping[str, str],
) -> None:
    """Each node's revision and switch while rolling: at most maxFetching nodes fetch at once.

    A node holds a fetch slot from the pass that tells it the new revision (its observed child
    says so) until it holds or serves it: judged from what was told, not from its report, since a
    pass may run before the node reported that it started (its own child update triggers one).
    A node with no copy yet downloads the new revision as its first, and takes no slot.
    """
    strategy = spec.update_strategy
    asked = out.target or spec.source.version
    keys = _keys(spec)

    def done(node: str) -> bool:
        status = statuses.get(node, {})
        return bool(out.target) and out.target in (keys.served(status), keys.held(status))

    def rolling_node(node: str) -> bool:  # serves a copy of another revision
        return bool(keys.served(statuses.get(node, {}))) and not done(node)

    switch = strategy.switch == names.SWITCH_EACH_NODE or all(done(n) for n in node_names)
    moving = [n for n in node_names if rolling_node(n) and told.get(n) in (asked, spec.source.version)]
    out.fetching = sum(
        1 for n in node_names if _next(statuses.get(n, {})).get("phase") == names.NEXT_DOWNLOADING
    )
    slots = strategy.max_fetching - len(moving) if strategy.max_fetching else len(node_names)
    for node in node_names:
        if not rolling_node(node) or node in moving:
            out.nodes[node] = NodeRoll(asked, switch)
        elif slots > 0:
            slots -= 1
            out.nodes[node] = NodeRoll(asked, switch)
        else:  # waits for a fetch slot: keeps what it was told, and serves it
            out.nodes[node] = NodeRoll(told.get(node) or keys.served(statuses.get(node, {})), True)


def _ready_counts(keys: _Keys, selected: Sequence[Mapping[str, Any]], target: str) -> list[Obj]:
    """Ready copies per commit (version): served ones, and the target held beside (ready to switch)."""
    counts: Counter[str] = Counter()
    for status in selected:
        served = keys.served(status)
        if served:
            counts[served] += 1
        if target and keys.held(status) == target:
            counts[target] += 1
    return [{"revision": r, "readyNodes": counts[r]} for r in sorted(counts)]


def status_fields(out: Rollout) -> Obj:
    """The cache's status fields for the rollout (resolvedRevision is the served commit)."""
    fields: Obj = {}
    if out.resolved:
        fields["resolvedRevision"] = out.resolved
    if out.requested:
        fields["requestedRevision"] = out.requested
    if out.rolling and out.target:
        fields["nextRevision"] = out.target
    if out.revisions:
        fields["revisions"] = out.revisions
    return fields


def rolling_condition(out: Rollout, spec: ModelCacheSpec, total: int) -> tuple[bool, str, str]:
    """(status, reason, message) of the Rolling condition."""
    if not out.rolling:
        return False, names.REASON_ROLLED, f"every selected node serves revision {_short(out.current)}"
    target = _short(out.target) if out.target else f"{spec.source.version} (not resolved yet)"
    strategy = spec.update_strategy
    limit = f", at most {strategy.max_fetching} fetching at once" if strategy.max_fetching else ""
    message = (
        f"rolling from revision {_short(out.current)} to {target}: {out.serving} of {total} nodes serve it, "
        f"{out.holding} hold it beside the old one, {out.fetching} fetching; switch {strategy.switch}{limit}; "
        "running Pods keep the revision they mounted until they end"
    )
    return True, names.REASON_ROLLING, message


def _short(revision: str) -> str:
    """A commit or digest cut to 12 characters, as git and kubectl show them; a prefix whole."""
    return revision if "/" in revision else revision[:12]
