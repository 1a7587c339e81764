"""The pure credentials mapping: Secret keys and annotations -> store settings, refusals naming keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from praesto.agent.download import DownloadError
from praesto.agent.download.origins.objstore.creds import (
    GCS_KEY_FILE,
    settings_from_env,
    settings_from_secret,
    store_config,
)

WHERE = "Secret team-a/creds"


def test_kserve_annotations_data_wins_and_praesto_overrides_kserve() -> None:
    settings = settings_from_secret(
        {
            "AWS_ACCESS_KEY_ID": "AKIA1",
            "AWS_SECRET_ACCESS_KEY": "s3cr3t",
            "AWS_REGION": "eu-west-1",
            "other": "x",
        },
        {
            "serving.kserve.io/s3-endpoint": "minio.store:9000",
            "serving.kserve.io/s3-usehttps": "0",
            "serving.kserve.io/s3-region": "us-west-2",
            "praesto.io/s3-verifyssl": "0",
        },
    )
    assert "other" not in settings and settings["AWS_REGION"] == "eu-west-1"
    cfg = store_config("s3", "models", settings, {}, WHERE)
    assert cfg.config["endpoint"] == "http://minio.store:9000" and cfg.config["region"] == "eu-west-1"
    assert cfg.config["virtual_hosted_style_request"] is False  # path style for S3-compatible stores
    assert (
        cfg.client_options["allow_http"] is True and cfg.client_options["allow_invalid_certificates"] is True
    )
    assert cfg.credentialed and "s3cr3t" not in repr(cfg) and "AKIA1" not in repr(cfg)


def test_nothing_configured_is_anonymous_never_the_metadata_endpoint() -> None:
    for scheme in ("s3", "gs"):
        cfg = store_config(scheme, "b", {}, {}, WHERE)
        assert cfg.config.get("skip_signature") is True and not cfg.credentialed
    cfg = store_config("az", "c", {"AZURE_STORAGE_ACCOUNT_NAME": "acct"}, {}, WHERE)
    assert cfg.config.get("skip_signature") is True


def test_workload_identity_from_the_environment() -> None:
    env = {"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token", "AWS_ROLE_ARN": "arn:aws:iam::1:role/r"}
    cfg = store_config("s3", "b", {}, env, WHERE)
    assert (
        cfg.config["role_arn"] == "arn:aws:iam::1:role/r" and cfg.described == "the workload identity (IRSA)"
    )
    gke = store_config("gs", "b", {}, {"PRAESTO_WORKLOAD_IDENTITY": "true"}, WHERE)
    assert gke.credentialed and "skip_signature" not in gke.config
    azure_env = {"AZURE_FEDERATED_TOKEN_FILE": "/t", "AZURE_CLIENT_ID": "id", "AZURE_TENANT_ID": "tn",
                 "AZURE_STORAGE_ACCOUNT_NAME": "acct"}  # fmt: skip
    azure = store_config("az", "c", {}, azure_env, WHERE)
    assert azure.config["federated_token_file"] == "/t" and azure.config["account_name"] == "acct"


@pytest.mark.parametrize(
    ("scheme", "settings", "needle"),
    [
        ("s3", {"AWS_ACCESS_KEY_ID": "AKIA1"}, "has AWS_ACCESS_KEY_ID but not AWS_SECRET_ACCESS_KEY"),
        ("az", {"AZURE_STORAGE_ACCESS_KEY": "k"}, "add AZURE_STORAGE_ACCOUNT_NAME"),
        (
            "az",
            {"AZURE_STORAGE_ACCOUNT_NAME": "a", "AZURE_CLIENT_ID": "i"},
            "not AZURE_TENANT_ID, AZURE_CLIENT_SECRET",
        ),
        ("gs", {GCS_KEY_FILE: "{not json"}, "is not a service-account key file"),
        ("s3", {"AWS_ENDPOINT_URL": "ftp://x"}, "must be an http(s) URL"),
        ("gs", {"GOOGLE_BASE_URL": "gcs.example:4443"}, "GOOGLE_BASE_URL must be an http(s) URL"),
        (
            "az",
            {"AZURE_STORAGE_ACCOUNT_NAME": "a", "AZURE_STORAGE_ENDPOINT": "127.0.0.1:10000"},
            "AZURE_STORAGE_ENDPOINT must be an http(s) URL",
        ),
    ],
)
def test_incomplete_secrets_name_the_key(scheme: str, settings: dict[str, str], needle: str) -> None:
    with pytest.raises(DownloadError) as info:
        store_config(scheme, "b", settings, {}, WHERE)
    assert needle in info.value.message and (WHERE in info.value.message or "ftp" not in needle)


def test_service_principal_and_gcs_key_map_to_the_store_settings(tmp_path: Path) -> None:
    sp = {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_CLIENT_ID": "i", "AZURE_TENANT_ID": "t",
          "AZURE_CLIENT_SECRET": "s", "AZURE_SUBSCRIPTION_ID": "sub"}  # fmt: skip
    cfg = store_config("az", "c", settings_from_secret(sp, None), {}, WHERE)
    assert (cfg.config["client_id"], cfg.config["tenant_id"], cfg.config["client_secret"]) == ("i", "t", "s")
    key = json.dumps(
        {"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\n", "client_email": "x"}
    )
    (tmp_path / GCS_KEY_FILE).write_text(key)
    gcs = store_config("gs", "b", settings_from_env({}, tmp_path), {}, WHERE)
    assert gcs.config["service_account_key"] == key and gcs.credentialed


def test_endpoint_overrides_for_emulators_and_compatible_stores(tmp_path: Path) -> None:
    """GOOGLE_BASE_URL (or the key file's own gcs_base_url) and AZURE_STORAGE_ENDPOINT: an
    http:// endpoint (an emulator on loopback) turns plain HTTP on, https:// leaves it off."""
    key = {"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\n", "client_email": "x"}
    (tmp_path / "GOOGLE_BASE_URL").write_text("http://127.0.0.1:4443/\n")
    (tmp_path / GCS_KEY_FILE).write_text(json.dumps(key))
    gcs = store_config("gs", "b", settings_from_env({}, tmp_path), {}, WHERE)
    assert gcs.config["base_url"] == "http://127.0.0.1:4443" and gcs.client_options["allow_http"] is True
    in_key = json.dumps({**key, "gcs_base_url": "http://fake-gcs:4443"})
    gcs = store_config("gs", "b", {GCS_KEY_FILE: in_key}, {}, WHERE)
    assert "base_url" not in gcs.config and gcs.client_options["allow_http"] is True
    secure = store_config("gs", "b", {"GOOGLE_BASE_URL": "https://gcs.example"}, {}, WHERE)
    assert secure.config["base_url"] == "https://gcs.example" and "allow_http" not in secure.client_options
    azurite = {"AZURE_STORAGE_ACCOUNT_NAME": "devstoreaccount1", "AZURE_STORAGE_ACCESS_KEY": "a2V5",
               "AZURE_STORAGE_ENDPOINT": "http://127.0.0.1:10000/devstoreaccount1/"}  # fmt: skip
    az = store_config("az", "c", settings_from_secret(azurite, None), {}, WHERE)
    assert az.config["endpoint"] == "http://127.0.0.1:10000/devstoreaccount1"
    assert az.client_options["allow_http"] is True and "a2V5" not in repr(az)


def test_ca_bundle_and_proxy_become_client_options(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    env = {"PRAESTO_CA_BUNDLE": str(bundle), "HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": ".svc"}
    cfg = store_config("s3", "b", {}, env, WHERE)
    assert cfg.client_options["root_certificate"].startswith("-----BEGIN CERTIFICATE")
    assert (
        cfg.client_options["proxy_url"] == "http://proxy:3128"
        and cfg.client_options["proxy_excludes"] == ".svc"
    )
