"""The OCI tests' token service grants what it was told and nothing else (testkit/registry_token.py)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testkit.registry_token import SERVICE, Grants, TokenService


def _ask(service: TokenService, scope: str, login: tuple[str, str] | None = None) -> dict[str, object]:
    request = urllib.request.Request(f"{service.realm}?service={SERVICE}&scope={scope}")
    if login is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(login).encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as answer:
        token = json.loads(answer.read())["token"]
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))  # type: ignore[no-any-return]


def test_grants_are_exactly_the_configured_ones(tmp_path: Path) -> None:
    grants = Grants(users={"alice": ("pw", {"team/a": {"pull"}})}, anonymous={"team/public": {"pull"}})
    with TokenService(tmp_path, grants) as service:
        alice = _ask(service, "repository:team/a:pull,push", ("alice", "pw"))
        assert alice["access"] == [{"type": "repository", "name": "team/a", "actions": ["pull"]}]
        assert alice["aud"] == SERVICE and alice["sub"] == "alice"
        assert _ask(service, "repository:team/b:pull", ("alice", "pw"))["access"] == []
        assert _ask(service, "repository:team/a:pull")["access"] == []  # anonymous gets only the public one
        assert _ask(service, "repository:team/public:pull")["access"] == [
            {"type": "repository", "name": "team/public", "actions": ["pull"]}
        ]
        with pytest.raises(urllib.error.HTTPError) as refused:
            _ask(service, "repository:team/a:pull", ("alice", "wrong"))
        assert refused.value.code == 401 and service.refused == 1
