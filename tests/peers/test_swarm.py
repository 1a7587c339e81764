"""The swarm's pure rules (agent/peers/swarm.py): which peer to ask, how often a part goes out."""

from __future__ import annotations

from praesto.agent.peers.swarm import Fanout, Offer, neighbours, pick_peer

PART = ("model.safetensors", 3)


def test_a_holder_is_preferred_to_the_seeder_and_the_least_busy_holder_wins() -> None:
    offers = {
        "seed": Offer(parts=frozenset({PART})),
        "b": Offer(parts=frozenset({PART}), busy=3),
        "c": Offer(parts=frozenset({PART}), busy=1),
        "d": Offer(parts=frozenset({("model.safetensors", 4)})),  # holds another part only
    }
    assert pick_peer(PART, offers, {}, "asker", seeders=["seed"]) == "c"
    # what this node already asks of a peer counts as that peer's load too
    assert pick_peer(PART, offers, {"c": 3}, "asker", seeders=["seed"]) == "b"
    assert pick_peer(PART, offers, {}, "asker", seeders=["seed"], exclude=["c", "b"]) == "seed"


def test_whole_files_and_ready_copies_hold_every_part() -> None:
    assert Offer(whole=frozenset({PART[0]})).holds(PART)
    assert Offer(complete=True).holds(PART)
    assert not Offer(parts=frozenset({(PART[0], 2)})).holds(PART)


def test_nobody_holding_the_part_means_waiting_at_the_seeder_else_nothing() -> None:
    offers = {"b": Offer(), "c": Offer()}
    assert pick_peer(PART, offers, {}, "asker", seeders=["seed"]) == "seed"
    assert pick_peer(PART, offers, {}, "asker") is None
    assert pick_peer(PART, offers, {}, "asker", seeders=["seed"], exclude=["seed"]) is None


def test_equally_busy_holders_are_spread_over_askers() -> None:
    offers = {f"p{i}": Offer(complete=True) for i in range(8)}
    chosen = {pick_peer(PART, offers, {}, f"asker-{n}") for n in range(64)}
    assert len(chosen) >= 6  # not every asker on the first holder


def test_a_part_goes_out_copies_times_per_window_then_again() -> None:
    fan = Fanout(copies=2, window=5.0)
    assert fan.claim([PART], "a", now=0.0)
    assert fan.claim([PART], "b", now=1.0)
    assert not fan.claim([PART], "c", now=2.0)  # sent twice: c finds it at a or b
    assert fan.claim([PART], "a", now=2.0)  # a retrying a cut transfer is not a new copy
    assert fan.claim([("model.safetensors", 4)], "c", now=2.0)  # other parts are their own
    assert not fan.claim([PART], "c", now=5.5)  # a's retry at 2.0 still counts
    assert fan.claim([PART], "c", now=7.5)  # the window passed: a dead receiver costs one window


def test_the_seeder_sends_each_part_once() -> None:
    fan = Fanout(copies=1)
    assert fan.claim([PART], "a", now=0.0)
    assert not fan.claim([PART], "b", now=0.1)
    assert not fan.claim([PART, ("model.safetensors", 4)], "b", now=0.1)  # a range over two parts
    assert fan.claim([("model.safetensors", 4)], "b", now=0.1)
    assert fan.spent(0.2) == {PART, ("model.safetensors", 4)}  # not offered in /parts meanwhile
    assert fan.spent(6.0) == set()


def test_neighbours_are_bounded_stable_and_differ_per_asker() -> None:
    peers = [f"10.0.0.{i}:7000" for i in range(100)]
    mine = neighbours("node-a", peers, 16)
    assert len(mine) == 16 and len(set(mine)) == 16
    assert mine == neighbours("node-a", list(reversed(peers)), 16)
    assert set(mine) != set(neighbours("node-b", peers, 16))
    assert "me" not in neighbours("me", ["me", "x"], 16)


def test_a_peer_receiving_the_part_comes_after_holders_and_before_the_seeder() -> None:
    offers = {
        "seed": Offer(arriving={PART: 900}),
        "b": Offer(arriving={PART: 500}),
        "c": Offer(arriving={PART: 800}, busy=2),
    }
    assert pick_peer(PART, offers, {}, "asker", seeders=["seed"]) == "b"  # passes it on as it arrives
    holder = {**offers, "d": Offer(parts=frozenset({PART}), busy=5)}
    assert pick_peer(PART, holder, {}, "asker", seeders=["seed"]) == "d"  # whole there: the busy one wins
    assert pick_peer(PART, offers, {}, "asker", seeders=["seed"], exclude=["b", "c"]) == "seed"
    assert not Offer(arriving={PART: 900}).holds(PART)
    # an asker that has the first 600 bytes already: only a peer with more is any use to it
    assert pick_peer(PART, offers, {}, "asker", seeders=["seed"], offset=600) == "c"
    assert pick_peer(PART, offers, {}, "asker", seeders=["seed"], offset=800) == "seed"
