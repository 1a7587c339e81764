"""Registry logins from a Docker config JSON, matched by host as Docker does (agent/download/origins/oci/auth.py)."""

from __future__ import annotations

import base64
import json

import pytest
from praesto.agent.download.api import LastingDownloadError
from praesto.agent.download.origins.oci.auth import challenge_of, credential_for

from praesto import names


def _config(auths: dict[str, object]) -> dict[str, str]:
    return {names.DOCKER_CONFIG_KEY: json.dumps({"auths": auths})}


def test_a_login_is_found_by_bare_host_or_url_and_docker_hub_by_any_of_its_names() -> None:
    auth = base64.b64encode(b"alice:s3cret").decode()
    config = _config({"https://registry.example.com:5000/v1/": {"auth": auth}, "https://index.docker.io/v1/": {
        "username": "bob", "password": "pw"}})  # fmt: skip
    found = credential_for("registry.example.com:5000", config, "Secret team/regcred")
    assert found is not None and (found.username, found.password) == ("alice", "s3cret")
    hub = credential_for("docker.io", config, "Secret team/regcred")
    assert hub is not None and hub.username == "bob"
    assert credential_for("other.example.com", config, "x") is None
    assert "s3cret" not in repr(found)  # never in a log line by accident


def test_a_config_that_is_not_json_is_refused_with_the_fix() -> None:
    with pytest.raises(LastingDownloadError, match="docker-registry"):
        credential_for("r.example.com", {names.DOCKER_CONFIG_KEY: "{not json"}, "Secret team/regcred")


def test_challenges_parse() -> None:
    scheme, params = challenge_of(
        'Bearer realm="https://auth.example/token",service="registry",scope="repository:a:pull"'
    )
    assert scheme == "bearer" and params == {
        "realm": "https://auth.example/token", "service": "registry", "scope": "repository:a:pull"}  # fmt: skip
    assert challenge_of('Basic realm="Registry Realm"')[0] == "basic"
