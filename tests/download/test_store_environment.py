"""Issue 39 item 2: the object-store origin gets the store clients' variables, never the whole environment.

The edge keeps only credscope.STORE_ENV (download/api.py StoreEnvironment.of); these checks prove the
list covers every name origins/objstore/creds.py reads, so store_config decides exactly as it did with
the whole environment, and that nothing else (nor any value) rides along.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from praesto.agent.download.api import EngineSettings, Options, StoreEnvironment
from praesto.agent.download.origins.objstore import creds
from praesto.agent.download.origins.objstore.creds import store_config
from praesto.agent.download.settings import DownloadSettings

from praesto import credscope

IDENTITY = {
    "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token",
    "AWS_ROLE_ARN": "arn:aws:iam::1:role/cluster",
    "GOOGLE_APPLICATION_CREDENTIALS": "/var/run/cluster-sa.json",
    "AZURE_FEDERATED_TOKEN_FILE": "/var/run/token",
    "AZURE_CLIENT_ID": "cluster",
    "AZURE_TENANT_ID": "tenant",
    "AZURE_STORAGE_ACCOUNT_NAME": "acct",
    "AWS_REGION": "eu-west-1",
    credscope.ENV_IDENTITY: "true",
    "HTTPS_PROXY": "http://proxy.example:3128",
    "NO_PROXY": "10.0.0.0/8",
}
UNRELATED = {"HF_TOKEN": "hf_secret_value", "HOME": "/root", "PATH": "/usr/bin", "KUBECONFIG": "/k"}


def _names_read(tree: ast.AST) -> set[str]:
    """Every `env.get(NAME)` / `env[NAME]` in creds.py, constants resolved through the module."""
    found: set[str] = set()
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            if isinstance(node.func.value, ast.Name) and node.func.value.id == "env" and node.args:
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "env":
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.add(key.value)
        elif isinstance(key, ast.Name) and isinstance(getattr(creds, key.id, None), str):
            found.add(getattr(creds, key.id))
    return found


def test_the_list_names_every_variable_store_config_reads() -> None:
    read = _names_read(ast.parse(Path(inspect.getfile(creds)).read_text()))
    assert read and "AWS_ROLE_ARN" in read and credscope.ENV_IDENTITY in read  # the scan sees them
    assert read <= set(credscope.STORE_ENV), read - set(credscope.STORE_ENV)
    assert set(credscope.IDENTITY_ENV) <= set(credscope.STORE_ENV)


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
@pytest.mark.parametrize("identity_allowed", [True, False])
def test_store_config_decides_as_it_did_with_the_whole_environment(
    scheme: str, identity_allowed: bool
) -> None:
    whole = {**IDENTITY, **UNRELATED}
    kept = StoreEnvironment.of(whole).as_dict()
    assert not set(kept) & set(UNRELATED)
    before = store_config(scheme, "b", {}, whole, "x", identity_allowed=identity_allowed)
    after = store_config(scheme, "b", {}, kept, "x", identity_allowed=identity_allowed)
    assert (after.config, after.client_options, after.credentialed, after.described) == (
        before.config, before.client_options, before.credentialed, before.described,
    )  # fmt: skip
    assert after.credentialed is identity_allowed  # the entitlement rule still strips IDENTITY_ENV


def test_every_edge_keeps_only_the_store_variables_and_never_shows_them() -> None:
    env = {**IDENTITY, **UNRELATED}
    section = EngineSettings.from_environment(env)
    assert section.store_environment == StoreEnvironment.of(env)
    assert DownloadSettings.from_env(env).environment == section
    options = Options.of(section)
    assert options.store_environment.as_dict() == {k: v for k, v in env.items() if k in credscope.STORE_ENV}
    for shown in (repr(section), repr(options), repr(DownloadSettings.from_env(env))):
        assert "arn:aws" not in shown and "hf_secret_value" not in shown and "cluster-sa" not in shown
    assert EngineSettings.from_environment(UNRELATED) == EngineSettings()  # nothing of it kept
