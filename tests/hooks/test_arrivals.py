"""The pure bounds of hooks/arrivals.py: who is closed at a cap, and whose turn a large body gets."""

from __future__ import annotations

from praesto.hooks.arrivals import BODY_GRACE, ArrivalLimits, Arrivals, LargeBodyTurns, body_due

LIMITS = ArrivalLimits(per_client=3, connections=10, buffered=1000)


def test_a_client_over_its_cap_loses_its_connection_silent_the_longest() -> None:
    arrivals: Arrivals[str] = Arrivals(LIMITS)
    for name in ("a1", "b1", "a2", "a3"):
        arrivals.add(name, name[0])
    arrivals.touch("a1", 10)  # a1 just sent bytes: a2 is now a's silent longest
    assert arrivals.victim("a", open_connections=4) is None  # three of a: at the cap, not over
    arrivals.add("a4", "a")
    assert arrivals.victim("a", open_connections=5) == ("a2", "client")
    assert arrivals.victim("b", open_connections=5) is None  # b is not over its cap, the worker has room


def test_a_full_worker_loses_its_connection_silent_the_longest_of_any_client() -> None:
    arrivals: Arrivals[str] = Arrivals(LIMITS)
    for name in ("a1", "b1", "c1"):
        arrivals.add(name, name[0])
    arrivals.touch("a1", 0)
    assert arrivals.victim(None, open_connections=9) is None
    assert arrivals.victim(None, open_connections=10) == ("b1", "connections")


def test_buffered_bytes_over_the_budget_close_the_silent_longest() -> None:
    arrivals: Arrivals[str] = Arrivals(LIMITS)
    arrivals.add("a1", "a")
    arrivals.add("b1", "b")
    arrivals.touch("a1", 600)
    arrivals.touch("b1", 600)
    assert arrivals.victim(None, 0) == ("a1", "bytes")
    arrivals.remove("a1")
    assert arrivals.buffered == 600 and arrivals.victim(None, 0) is None
    assert len(arrivals) == 1 and arrivals.count("a") == 0


def test_turns_go_round_the_client_addresses() -> None:
    turns: LargeBodyTurns[str] = LargeBodyTurns()
    assert turns.ask("a1", "a")
    for name in ("a2", "a3", "a4", "b1", "b2", "c1"):
        assert not turns.ask(name, name[0])
    order = [turns.release() for _ in range(6)]
    # a held first: b and c (never served) go before a's second, then round by last turn
    assert order == ["b1", "c1", "a2", "b2", "a3", "a4"]
    assert turns.release() is None and turns.holder is None


def test_a_withdrawn_waiter_never_gets_the_turn() -> None:
    turns: LargeBodyTurns[str] = LargeBodyTurns()
    turns.ask("a1", "a")
    turns.ask("b1", "b")
    turns.withdraw("b1", "b")
    assert turns.release() is None


def test_a_large_body_buys_time_by_arriving() -> None:
    assert body_due(100.0, 0, 4 << 20) == 100.0 + BODY_GRACE
    assert body_due(100.0, 8 << 20, 4 << 20) == 100.0 + BODY_GRACE + 2
