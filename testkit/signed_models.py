"""Models signed the way their publishers sign them: the OpenSSF `model-signing` library's own
signing API (`model_signing.signing.Config`), with keys and certificates the tests make."""

from __future__ import annotations

import tempfile
from pathlib import Path

import model_signing

from praesto.names import DEFAULT_SIGNATURE_FILE
from testkit.pki import CertificateAuthority, KeyPair, signing_key


def _signed(
    files: dict[str, bytes], config: model_signing.signing.Config, ignore: tuple[str, ...] = ()
) -> dict[str, bytes]:
    """`files` plus the bundle `config` signs them into, at the library's default path; `ignore`:
    paths the signer leaves out (`model_signing sign --ignore-paths`, recorded in the payload)."""
    with tempfile.TemporaryDirectory(prefix="praesto-sign-") as scratch:
        model = Path(scratch) / "model"
        for name, data in files.items():
            (model / name).parent.mkdir(parents=True, exist_ok=True)
            (model / name).write_bytes(data)
        signature = Path(scratch) / DEFAULT_SIGNATURE_FILE
        if ignore:
            hashing = model_signing.hashing.Config().set_ignored_paths(paths=ignore)  # type: ignore[no-untyped-call]
            config = config.set_hashing_config(hashing)
        config.sign(model, signature)
        return {**files, DEFAULT_SIGNATURE_FILE: signature.read_bytes()}


def key_pair(path: Path) -> KeyPair:
    """An EC P-256 key: private key at `path`, public key (what verifies) at `path.pub`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return signing_key(path)


def sign_with_key(files: dict[str, bytes], key: KeyPair, ignore: tuple[str, ...] = ()) -> dict[str, bytes]:
    config = model_signing.signing.Config()  # type: ignore[no-untyped-call]  # its __init__ lacks -> None
    return _signed(files, config.use_elliptic_key_signer(private_key=key.key_path), ignore)


def sign_with_certificate(
    files: dict[str, bytes], ca: CertificateAuthority, common_name: str = "model-publisher"
) -> dict[str, bytes]:
    """Signed by a fresh code-signing certificate `ca` issues; the bundle carries the chain."""
    leaf = ca.issue(common_name, common_name=common_name, code_signing=True)
    config = model_signing.signing.Config()  # type: ignore[no-untyped-call]  # its __init__ lacks -> None
    config = config.use_certificate_signer(
        private_key=leaf.key_path, signing_certificate=leaf.cert_path, certificate_chain=[ca.cert_path]
    )
    return _signed(files, config)
