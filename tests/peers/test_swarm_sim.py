"""bench/swarm_sim.py's invariants, on a small model: the agent's swarm rules stay flat in N.

The simulation drives the agent's own `swarm` rules (pick_peer, Fanout,
neighbours), so these pin that those rules keep the origin at one copy, finish
every node, and keep the time to all Ready nearly flat from 16 to 1,024 nodes
while the star (every copy from the seeder) grows linearly with N.
"""

from __future__ import annotations

from bench.swarm_sim import Setup, simulate


def small(nodes: int, swarm: bool = True) -> Setup:
    """256 MiB in 16 parts: twice the parts in flight per node."""
    return Setup(nodes=nodes, swarm=swarm, parts=16, part_bytes=16 << 20)


def test_swarm_time_stays_flat_to_1024_nodes_while_the_star_grows_linearly() -> None:
    alone = simulate(small(1))
    runs = {
        (n, swarm): simulate(small(n, swarm))
        for n, swarm in [(16, True), (1024, True), (16, False), (256, False)]
    }
    for out in [alone, *runs.values()]:
        assert out.origin_bytes == out.model_bytes  # 1.00x the model, star and swarm alike
    for (n, _), out in runs.items():
        assert out.ready == n  # every node completes
    swarm16, swarm1024 = runs[16, True].seconds, runs[1024, True].seconds
    star16, star256 = runs[16, False].seconds, runs[256, False].seconds
    assert swarm1024 <= 2 * swarm16, (swarm16, swarm1024)  # 64x the nodes, a small factor the time
    assert swarm16 <= 3 * alone.seconds
    assert star256 >= 0.6 * 16 * star16, (star16, star256)  # 16x the nodes, ~16x the time
    # the seeder uploads a few copies in the swarm, N-1 in the star
    assert runs[1024, True].seeder_upload <= 8 * runs[1024, True].model_bytes
    assert runs[256, False].seeder_upload == 255 * runs[256, False].model_bytes


def test_passing_parts_on_as_they_arrive_shortens_the_tail() -> None:
    """The default 2 GiB model: with cut-through the swarm's tail above one node stays small at
    1,024 nodes; parts passed on only once whole (the agent before it) add a hop per doubling."""
    whole_only = Setup(nodes=1, cut_through=False)
    alone = simulate(Setup(nodes=1)).seconds
    assert simulate(whole_only).seconds == alone  # one node has nobody to pass parts to
    cut = simulate(Setup(nodes=256))
    old = simulate(Setup(nodes=256, cut_through=False))
    assert cut.ready == old.ready == 256 and cut.origin_bytes == cut.model_bytes
    assert cut.seconds < old.seconds
    assert cut.seconds <= 1.15 * alone, (cut.seconds, alone)
