"""The peer wire's paths: what the asking side builds is what the server's routes match (protocol.py
holds both), field for field."""

from __future__ import annotations

from praesto.agent.peers.protocol import (
    FILE_ROUTE,
    PARTS_ROUTE,
    XORBS_QUERY,
    XORBS_ROUTE,
    file_path,
    parts_path,
    xorbs_path,
)

REV, CAS, XORB, FILE = "a" * 40, "c" * 32, "b" * 64, "f" * 64


def test_each_built_path_matches_its_route_and_no_other() -> None:
    built = {
        FILE_ROUTE: file_path("team-a", "m", REV, "sub/model%20a.bin"),
        PARTS_ROUTE: parts_path("team-a", "m", REV),
        XORBS_ROUTE: xorbs_path("team-a", "m", REV, CAS, XORB, 3, 9, FILE).partition("?")[0],
    }
    for route, path in built.items():
        matched = [r for r in built if r.match(path)]
        assert matched == [route], path
    file = FILE_ROUTE.match(built[FILE_ROUTE])
    assert file is not None and file.groups() == ("team-a", "m", REV, "sub/model%20a.bin")
    xorbs = XORBS_ROUTE.match(built[XORBS_ROUTE])
    assert xorbs is not None and xorbs.groups() == ("team-a", "m", REV, CAS, XORB)
    query = xorbs_path("team-a", "m", REV, CAS, XORB, 3, 9, FILE).partition("?")[2]
    asked = XORBS_QUERY.fullmatch(query)  # what xorbserve.parse reads back
    assert asked is not None and asked.groups() == ("3", "9", FILE)
