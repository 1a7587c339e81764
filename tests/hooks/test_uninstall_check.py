"""`praesto uninstall-check`, the chart's pre-delete hook: its decision and its wait, without a cluster.

The real path (Helm running the hook Job on a real kubelet against the real API server) is
tests/node/test_helm_lifecycle.py; here the pure core and the wait loop with a list in memory.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from praesto.hooks import uninstall_check as uc
from praesto.hooks.cli import main as praesto_main

from testkit.helm_chart import CHART_DIR

RELEASE = uc.Release("praesto", "praesto-system", 3)


def cache(name: str, namespace: str = "team-a", *, deleting: bool = False) -> uc.Cache:
    return uc.Cache(namespace, name, "Ready", deleting)


def test_no_cache_lets_the_uninstall_go() -> None:
    verdict = uc.decide([], delete_all=False, release=RELEASE)
    assert verdict.proceed and "no ModelCache exists" in verdict.message


def test_caches_refuse_naming_them_and_both_ways_on() -> None:
    verdict = uc.decide([cache("llama"), cache("bert", "team-b")], delete_all=False, release=RELEASE)
    assert verdict.exit_code == uc.EXIT_REFUSED and not verdict.to_delete
    message = verdict.message
    assert "refusing to uninstall praesto, nothing was removed: 2 ModelCaches still exist" in message
    assert "\n" not in message  # Helm v4 prints it as one log record, newlines escaped
    assert message.index("team-a/llama") < message.index("team-b/bert")  # sorted by namespace/name
    assert "kubectl delete modelcaches.praesto.praesto.io --all --all-namespaces --wait" in message
    assert "helm uninstall praesto --namespace praesto-system" in message
    assert "`helm rollback praesto 3 --namespace praesto-system`" in message
    assert f"--reuse-values --set {uc.DELETE_VALUE}=true" in message


def test_a_long_list_is_cut_and_counted() -> None:
    caches = [cache(f"m{i:03}") for i in range(uc.LISTED + 5)]
    message = uc.decide(caches, delete_all=False, release=RELEASE).message
    assert "team-a/m019" in message and "team-a/m020" not in message
    assert "team-a/m019 and 5 more (kubectl get modelcaches.praesto.praesto.io -A)" in message


def test_delete_all_deletes_those_not_already_going() -> None:
    verdict = uc.decide([cache("a"), cache("b", deleting=True)], delete_all=True, release=RELEASE)
    assert verdict.proceed and verdict.to_delete == (cache("a"),)
    assert f"{uc.DELETE_VALUE} is on: deleting 2 ModelCaches" in verdict.message


class FakeCluster:
    """Deleted caches go after `ticks` polls; their copies one poll later."""

    def __init__(self, caches: list[uc.Cache], ticks: int) -> None:
        self.items = {c.ref: c for c in caches}
        self.deleted: list[str] = []
        self.ticks = ticks
        self.polls = 0

    def caches(self) -> list[uc.Cache]:
        self.polls += 1
        if self.polls > self.ticks:
            for ref in self.deleted:
                self.items.pop(ref, None)
        return list(self.items.values())

    def cache_nodes(self) -> list[uc.CacheNode]:
        return [uc.CacheNode(c.namespace, c.name, "node-1", "deleting: waiting for 1 Pod mount(s)")
                for c in self.items.values()]  # fmt: skip

    def labelled_nodes(self) -> list[str]:
        return ["node-1"] if self.items else []

    def delete(self, cache: uc.Cache) -> None:
        self.deleted.append(cache.ref)


def run(cluster: FakeCluster, wait: float, delete_all: bool = True) -> tuple[int, list[str]]:
    said: list[str] = []
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    code = uc.run(cluster, delete_all=delete_all, release=RELEASE, wait_seconds=wait,  # type: ignore[arg-type]
                  say=said.append, clock=lambda: now[0], sleep=sleep)  # fmt: skip
    return code, said


def test_forced_waits_until_every_cache_and_copy_is_gone() -> None:
    cluster = FakeCluster([cache("a"), cache("b")], ticks=3)
    code, said = run(cluster, wait=60)
    assert code == uc.EXIT_OK and sorted(cluster.deleted) == ["team-a/a", "team-a/b"]
    assert "every ModelCache and copy is gone" in said[-1]


def test_forced_past_the_deadline_fails_naming_what_is_left() -> None:
    cluster = FakeCluster([cache("a")], ticks=10**6)
    code, said = run(cluster, wait=10)
    assert code == uc.EXIT_REFUSED
    assert "team-a/a (Ready); copy of team-a/a on node-1: deleting: waiting" in said[-1]
    assert "delete those Pods" in said[-1] and "readiness labels still on Node node-1" in said[-1]


def test_refusal_deletes_nothing() -> None:
    cluster = FakeCluster([cache("a")], ticks=0)
    code, _ = run(cluster, wait=10, delete_all=False)
    assert code == uc.EXIT_REFUSED and cluster.deleted == []


def test_usage_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        praesto_main(
            [
                "uninstall-check",
                "--release",
                "praesto",
                "--namespace",
                "x",
                "--revision",
                "1",
                "--wait-seconds",
                "soon",
            ]
        )
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--wait-seconds" in err


def test_the_chart_value_is_the_one_the_messages_name() -> None:
    values: Any = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    section, key = uc.DELETE_VALUE.split(".")
    assert values[section][key] is False
