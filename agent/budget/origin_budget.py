"""The cluster-wide origin budget on one node: slots held while its downloads pull from the origin.

Why Leases and no new service: every agent already talks to the API server, and
a Lease is a record with an expiry (a crashed agent's claim lapses by itself).
Each node queues for a group (`maxNodes`, and `perHost` per origin) with a Lease of
its own, `praesto-origin-<group>.<node>` in the release namespace, which only it
may write (the chart's policy); whose turn it is and who may pull is slots.py. A
node holds a group once for all its downloads together: the budget counts nodes,
not downloads. Groups are taken in one order, the origin's first, then the
cluster-wide one, and a node keeps what it holds while it waits for the next:
with one order no two nodes can each hold what the other waits for, and a node
waiting for a busy origin does not take one of the cluster's places meanwhile.

Where it gates: at the origin's byte source (`use.GatedSource`, handed to the download
as `PartSources.throttle`), before the first origin request of a download, not
before the download. So a node waiting for the budget still copies from peers
whatever they can give, and a download that peers serve entirely never takes a
slot. Metadata calls (resolving the revision and listing files: a few small API
requests) are not counted. The slot is renewed while any download of the node
uses it and given back when the last one ends, failed or not.

Retry-After: an origin answering 429/503 with Retry-After makes the node that got
it write "no request before T" on the host's Lease (`praesto.io/retry-after-until`);
every node reads it (at most every `cooldown_refresh` seconds) before its origin
requests to that host, so one node's 429 slows every node's next attempt.

Waiting is reported on the ModelCacheNode (`WaitingForOriginBudget`, naming the
limit, the holding nodes and the chart value to raise) and is never an error.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from praesto.agent.budget import slots
from praesto.agent.budget.leases import LeaseApi
from praesto.agent.budget.slots import GLOBAL, Cooldown, Pace
from praesto.agent.budget.use import OriginUse
from praesto.agent.download.api import (
    DownloadCancelled,
    Downloader,
    Options,
    OriginThrottle,
    PartSources,
    Plan,
    Result,
)
from praesto.agent.download.origins import origin_for

log = logging.getLogger("praesto.agent.budget")
Report = Callable[[str], None]  # why the download waits, for the copy's status


@dataclass(frozen=True)
class BudgetConfig:
    namespace: str  # the release namespace: where the Leases live
    max_nodes: int = 0  # nodes pulling from any origin at once; 0: no cluster-wide limit
    per_host: int = 0  # nodes pulling from one source host at once; 0: no per-host limit
    bytes_per_second: int = 0  # the cluster's origin rate, shared as max_nodes equal parts; 0: none
    lease_seconds: int = 30  # a holder that stops renewing loses its slot after this long
    max_retry_after: float = 600.0  # the longest Retry-After any node's origin may impose on all
    poll_seconds: float = 2.0  # how often a waiting node looks again at the (watched) slots unchanged
    cooldown_refresh: float = 1.0  # how stale a node's view of a host's Retry-After may be


def origin_host(plan: Plan, options: Options) -> str:
    """What `perHost` and Retry-After count by: the origin's own answer (download/origin.py `host`):
    the Hub endpoint's host, the registry's, or an object store's bucket at its endpoint."""
    return origin_for(plan.source.scheme).host(plan, options)


class OriginBudget:
    def __init__(
        self, config: BudgetConfig, leases: LeaseApi, node: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.config, self.leases, self.node, self.clock = config, leases, node, clock
        self.pace = Pace(slots.share(config.bytes_per_second, config.max_nodes))
        self._lock = threading.Lock()  # the maps below
        self._taking = threading.Lock()  # one acquisition at a time: never two slots of a group
        self._held: dict[str, tuple[str, float]] = {}  # group -> (claim Lease name, last renewed)
        self._users: dict[str, int] = {}  # group -> downloads of this node using it
        self._waiters: dict[str, int] = {}  # group -> downloads of this node waiting for it
        self._requests: dict[str, int] = {}  # host -> origin requests in flight (counted by hold())
        self._yielding: set[str] = set()  # groups given up for fairness, unmarked once their requests end
        self._cooldowns: dict[str, tuple[float, Cooldown | None]] = {}  # host -> (read at, what)
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    # ---- the agent's hooks ---------------------------------------------------------
    def attach(self, namespace: str, plan: Plan, options: Options, *, report: Report) -> OriginThrottle:
        """Before a download for `namespace`: what its origin requests go through
        (`PartSources.throttle`), this budget's use for the plan's origin host."""
        host = origin_host(plan, options)
        return OriginUse(self, host, namespace, report, options.cancel)

    def releasing(self, downloader: Downloader) -> Downloader:
        """`downloader`, giving the download's share of the slots back however it ends."""

        def run(plan: Plan, dest: Path, options: Options, sources: PartSources) -> Result:
            try:
                return downloader(plan, dest, options, sources)
            finally:
                if isinstance(sources.throttle, OriginUse):
                    sources.throttle.done()

        return run

    def stop(self) -> None:
        """Give every slot back at once (agent shutdown), rather than letting them expire."""
        self._stop.set()
        with self._lock:
            held, self._held = dict(self._held), {}
        for name, _ in held.values():
            self._give_back(name)
        self.leases.stop_watch()

    # ---- slots ---------------------------------------------------------------------
    def groups(self, host: str) -> list[str]:
        """The groups `host` needs, in the one order every node takes them: the origin's, then all."""
        return [g for g, n in ((host, self.config.per_host), (GLOBAL, self.config.max_nodes)) if n > 0]

    def hold(
        self, host: str, namespace: str, cancel: threading.Event, report: Callable[[str], None], *, join: bool
    ) -> None:
        """Return once this node holds every group `host` needs, queueing for a download of `namespace`;
        `join` counts one more download using them."""
        groups = self.groups(host)
        with self._lock:
            for g in groups:
                self._waiters[g] = self._waiters.get(g, 0) + 1
        joined = False
        try:
            said = ""
            while True:
                with self._lock:
                    missing = [g for g in groups if g not in self._held]
                    if not missing:
                        if join:
                            for g in groups:
                                self._users[g] = self._users.get(g, 0) + 1
                        self._requests[host] = self._requests.get(host, 0) + 1  # with the check: atomic
                        joined = True
                        return
                if cancel.is_set():
                    raise DownloadCancelled()
                if not self._taking.acquire(timeout=self.config.poll_seconds):
                    continue
                seen = self.leases.version  # a change from here on wakes the wait below at once
                try:
                    waiting = self._take(missing, namespace)
                except Exception as err:  # the API unreachable: wait and look again, say why
                    waiting = f"cannot reach the origin budget's Leases ({type(err).__name__}); pulling nothing from the origin until it can"
                finally:
                    self._taking.release()
                if not waiting:  # held, or written meanwhile: look again at once
                    continue
                if waiting != said:
                    log.info("%s", waiting)
                    report(waiting)
                    said = waiting
                # the watched Leases change (a slot freed, a mark taken back), or the time passes
                # (a holder that stopped renewing lapses without any write): look again, in memory
                if self.leases.wait(seen, self.config.poll_seconds * (0.75 + random.random() / 2), cancel):  # noqa: S311 - jitter
                    raise DownloadCancelled()
        finally:
            self._done_waiting(groups, joined or not join)

    def request_done(self, host: str) -> None:
        """An origin request that `hold` let through has ended."""
        with self._lock:
            self._requests[host] = self._requests.get(host, 0) - 1
            if self._requests[host] <= 0:
                self._requests.pop(host)

    def _quiet(self, group: str) -> bool:
        """No origin request of `group` in flight (call with the lock held)."""
        return not any(n > 0 for host, n in self._requests.items() if group in (GLOBAL, host))

    def _done_waiting(self, groups: list[str], using: bool) -> None:
        """A download stops waiting: claims nobody on this node uses or waits for any more go back."""
        free: list[str] = []
        with self._lock:
            for g in groups:
                self._waiters[g] = self._waiters.get(g, 0) - 1
                if self._waiters[g] <= 0:
                    self._waiters.pop(g)
                    if not using and self._users.get(g, 0) <= 0:
                        held = self._held.pop(g, None)
                        free.append(held[0] if held else slots.claim_name(g, self.node))
        for name in free:
            self._give_back(name)
        self._unwatch_if_idle()

    def leave(self, host: str) -> None:
        """One download stopped using the origin; the last one gives the claims back."""
        free: list[str] = []
        with self._lock:
            for g in self.groups(host):
                self._users[g] = self._users.get(g, 0) - 1
                if self._users[g] <= 0:
                    self._users.pop(g)
                    if not self._waiters.get(g):  # held, or lost meanwhile: the claim goes back either way
                        held = self._held.pop(g, None)
                        free.append(held[0] if held else slots.claim_name(g, self.node))
        for name in free:
            self._give_back(name)
        self._unwatch_if_idle()

    def _unwatch_if_idle(self) -> None:
        """Nothing on this node holds, gives up or waits for a slot: no watch of the Leases either."""
        with self._lock:
            idle = not (self._held or self._yielding or self._waiters or self._users)
        if idle:
            self.leases.stop_watch()

    def _count(self, group: str) -> tuple[int, str]:
        if group == GLOBAL:
            return self.config.max_nodes, "originBudget.maxNodes"
        return self.config.per_host, "originBudget.perHost"

    def _take(self, missing: list[str], namespace: str) -> str | None:
        """One look at the queues of the missing groups, in order, claiming and marking as needed: None
        when all are held, '' to look again at once (just written), else why this node waits."""
        leases, now = self.leases.list(), self.clock()
        seconds = self.config.lease_seconds
        for group in missing:
            name = slots.claim_name(group, self.node)
            mine = leases.get(name)
            if mine is None or not slots.is_live(mine, now, seconds) or slots.holder(mine) != self.node:
                self.leases.write(slots.claimed(mine, name, self.node, now, seconds, namespace))
                return ""
            if slots.renewal_due(mine, now, seconds):
                mine = leases[name] = (
                    self.leases.write(slots.claimed(mine, name, self.node, now, seconds)) or mine
                )
            count, value = self._count(group)
            held_by = slots.holders(leases, group, count, now, seconds)
            with self._lock:
                yielding = group in self._yielding
            if yielding:  # its place goes to another namespace once this node's requests end
                return slots.describe(group, count, held_by, value)
            if slots.pulling_since(mine) is None:
                if self.node in slots.next_up(leases, group, count, now, seconds):
                    self.leases.write(slots.marked(mine, True))
                    return ""  # read again: it pulls only if its mark is among the first `count`
                return slots.describe(group, count, held_by, value)
            if self.node not in held_by:  # another node marked first: take the mark back, wait
                self.leases.write(slots.marked(mine, False))
                return slots.describe(group, count, held_by, value)
            with self._lock:
                self._held[group] = (name, now)
            if self._renewer is None:
                self._renewer = threading.Thread(
                    target=self._renew_loop, name="praesto-origin-budget", daemon=True
                )
                self._renewer.start()
        return None

    def _give_back(self, name: str) -> None:
        try:
            lease = self.leases.get(name)
            if lease is not None and slots.holder(lease) == self.node:
                self.leases.write(slots.released(lease))
        except Exception as err:  # it lapses on its own
            log.warning(
                "could not give back origin claim %s (%s); it lapses by itself", name, type(err).__name__
            )

    def _renew_loop(self) -> None:
        seconds = self.config.lease_seconds
        while not self._stop.wait(seconds / 3):
            with self._lock:
                held, yielding = dict(self._held), set(self._yielding)
            if not held and not yielding:
                self._unwatch_if_idle()
                continue
            lost: list[str] = []
            try:
                leases, now = self.leases.list(), self.clock()
            except Exception as err:
                log.warning("could not renew origin claims: %s", type(err).__name__)
                now = self.clock()
                lost = [g for g, (_, renewed) in held.items() if now - renewed >= seconds]
                leases = {}
            if leases:
                self._finish_yielding(yielding, leases, now)
            for group, (name, _) in held.items():
                if not leases:
                    break
                lease = leases.get(name)
                try:
                    if (
                        lease is None
                        or not slots.is_live(lease, now, seconds)
                        or slots.holder(lease) != self.node
                    ):
                        lost.append(group)
                        continue
                    count, _ = self._count(group)
                    if self.node not in slots.holders(leases, group, count, now, seconds):
                        lost.append(group)  # an earlier mark came back: over the budget, stop at once
                        self.leases.write(slots.marked(lease, False))
                        continue
                    if slots.should_yield(leases, group, count, self.node, now, seconds):
                        lost.append(group)  # fairness: no new request; unmarked once the last one ends
                        with self._lock:
                            self._yielding.add(group)
                    if self.leases.write(slots.claimed(lease, name, self.node, now, seconds)) is not None:
                        with self._lock:
                            if self._held.get(group, ("",))[0] == name:
                                self._held[group] = (name, now)
                except Exception as err:
                    log.warning("could not renew origin claim %s: %s", name, type(err).__name__)
            with self._lock:
                for group in lost:
                    if group in self._held and self._held[group][0] == held[group][0]:
                        log.warning("gave up origin claim %s; waiting for the budget again", held[group][0])
                        del self._held[group]

    def _finish_yielding(self, yielding: set[str], leases: dict[str, slots.Lease], now: float) -> None:
        """A place given up for fairness keeps its mark, renewed, until this node's requests under it
        end: only then may another node take it, so the budget is never exceeded meanwhile."""
        seconds = self.config.lease_seconds
        for group in yielding:
            lease = leases.get(slots.claim_name(group, self.node))
            with self._lock:
                quiet = self._quiet(group)
            try:
                if lease is None or slots.holder(lease) != self.node:
                    pass
                elif quiet:
                    self.leases.write(slots.marked(lease, False))
                else:
                    self.leases.write(
                        slots.claimed(lease, str(lease["metadata"]["name"]), self.node, now, seconds)
                    )
                    continue
            except Exception as err:
                log.warning("could not give up origin place for %s: %s", group or "all", type(err).__name__)
                continue
            with self._lock:
                self._yielding.discard(group)

    # ---- Retry-After -------------------------------------------------------------
    def cooldown(self, host: str) -> Cooldown | None:
        now = time.monotonic()
        with self._lock:
            cached = self._cooldowns.get(host)
        if cached is not None and now - cached[0] < self.config.cooldown_refresh:
            return cached[1]
        try:
            lease = self.leases.cached(slots.host_lease_name(host))  # the watch's copy while one runs
            seen = slots.cooldown_of(lease, self.clock(), self.config.max_retry_after)
        except Exception as err:
            log.warning("could not read the Retry-After of %s: %s", host, type(err).__name__)
            seen = cached[1] if cached else None
        with self._lock:
            mine = self._cooldowns.get(host, (0.0, None))[1]
            if mine is not None and (seen is None or mine.until > seen.until):
                seen = mine  # our own 429, not written yet
            self._cooldowns[host] = (now, seen)
        return seen

    def wait_cooldown(self, host: str, cancel: threading.Event, report: Callable[[str], None]) -> None:
        said = False
        while (c := self.cooldown(host)) is not None and (left := c.until - self.clock()) > 0:
            if not said:
                message = (
                    f"{host} answered node {c.by or 'another node'} with HTTP 429/503 and Retry-After: no node "
                    f"sends it a request before {slots.rfc3339(c.until)}, {left:.0f}s from now"
                )
                log.info("%s", message)
                report(message)
                said = True
            if cancel.wait(min(left, self.config.cooldown_refresh)):
                raise DownloadCancelled()

    def record_cooldown(self, host: str, seconds: float) -> None:
        """The origin told this node to wait `seconds`: tell every node, through the host's Lease."""
        cooldown = Cooldown(self.clock() + min(seconds, self.config.max_retry_after), self.node)
        with self._lock:
            self._cooldowns[host] = (time.monotonic(), cooldown)
        name = slots.host_lease_name(host)
        try:
            for _ in range(3):  # each conflict means another node wrote its own Retry-After meanwhile
                body = slots.with_cooldown(self.leases.get(name), name, host, cooldown, self.clock())
                if body is None or self.leases.write(body) is not None:
                    return
        except Exception as err:
            log.warning("could not share the Retry-After of %s: %s", host, type(err).__name__)
