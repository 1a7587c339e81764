"""Signed models: an OpenSSF model-signing bundle checked against the files about to be published.

The check uses the OpenSSF `model-signing` library (sigstore/model-transparency, tag v1.1.1):
`model_signing.verifying.Config` (src/model_signing/verifying.py) with
`use_elliptic_key_verifier(public_key=...)`, `use_certificate_verifier(certificate_chain=...)` or
`use_sigstore_verifier(identity=..., oidc_issuer=...)`, then `.verify(model_dir, signature)`. That
verifies the bundle's signature, then hashes every file under the model directory and compares the
result with the signed manifest: a changed, extra or missing file fails it.

What is not hashed, and why: the library's own defaults (src/model_signing/hashing.py,
`Config.hash`: `.git/`, `.gitattributes`, `.github/`, `.gitignore`), the paths the signer declared
ignored in the signed payload (`serialization.ignore_paths`, as `verifying.Config.verify` adds them),
the signature file itself (the library's CLI ignores it the same way: src/model_signing/_cli.py,
`_resolve_ignore_paths(model_path, list(ignore_paths) + [signature])`), and this store's own
bookkeeping at the top of the tree (`.praesto*`, a prefix no source file may have: repopath.check_repo_path).

The hashing configuration (files or shards, sha256/blake2/blake3) is the one the signer used, read
from the payload as `verifying.Config._guess_hashing_config` does, so any model the library signs
verifies here. The check runs on the staged tree before publication (fetch/): a model that
fails it is never renamed into place and no complete marker is written.

A verified model publishes exactly the files the signature covers (the payload's resources) and
the bundle itself: what the library does not hash (the git paths, the signer's ignore_paths) is
removed from the tree after verification and listed in the manifest's signature record
(`names.MANIFEST_SIGNATURE_EXCLUDED`), never published beside a "verified" model (issue 37 item 4). Excluded rather than
refused: every Hugging Face repository carries `.gitattributes`, and `model_signing sign` skips it
by default, so refusing would refuse every signed Hub model for a file no Pod needs; a Pod reading
the copy sees only what the signer vouched for either way.
"""

from __future__ import annotations

import ast
import base64
import binascii
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from praesto.agent.download.api import LastingDownloadError, SignaturePolicy, TemporaryDownloadError
from praesto.agent.download.repopath import RESERVED_PREFIX

from praesto.names import DEFAULT_SIGNATURE_FILE, MANIFEST_SIGNATURE_EXCLUDED, REASON_SIGNATURE_INVALID

LIBRARY = "model-signing 1.1.1"
REASON = REASON_SIGNATURE_INVALID
_FIX = {
    "publicKey": "sign the model with the private key paired with this public key",
    "certificate": "sign the model with a certificate issued under the configured CA certificates",
    "sigstore": "sign the model with Sigstore as the configured identity and OIDC issuer",
}

log = logging.getLogger("praesto.download")


def _refuse(policy: SignaturePolicy, cause: str, fix: str | None = None) -> LastingDownloadError:
    return LastingDownloadError(
        REASON, f"{policy.path}: {cause}; {fix or _FIX.get(policy.method, 'sign the model')}"
    )


def _bundle(policy: SignaturePolicy, path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise _refuse(
            policy,
            "missing: the model has no signature file at its root",
            f"sign the model (e.g. `model_signing sign key MODEL --private_key KEY --signature "
            f"{policy.path}`) and publish {policy.path} with it",
        )
    try:
        data = json.loads(path.read_bytes())
        payload = json.loads(base64.b64decode(data["dsseEnvelope"]["payload"], validate=True))
        serialization = payload["predicate"]["serialization"]
        if not isinstance(serialization, dict) or not isinstance(data, dict):
            raise TypeError("serialization is not an object")
    except (OSError, ValueError, KeyError, TypeError, binascii.Error) as error:
        raise _refuse(
            policy,
            f"not an OpenSSF model-signing bundle ({type(error).__name__}: {error})",
            f"publish the bundle `model_signing sign` wrote, unchanged, as {policy.path}",
        ) from None
    return data


def _hashing_config(bundle: dict[str, Any], tree: Path, policy: SignaturePolicy) -> Any:
    """The signer's hashing configuration (as the library guesses it), ignoring what must be."""
    from model_signing import hashing

    args = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))["predicate"]["serialization"]
    method, algorithm = args.get("method"), args.get("hash_type", "sha256")
    config = hashing.Config()  # type: ignore[no-untyped-call]  # model-signing's __init__ lacks -> None
    try:
        if method == "files":
            config = config.use_file_serialization(hashing_algorithm=algorithm)
        elif method == "shards":
            config = config.use_shard_serialization(
                hashing_algorithm=algorithm, shard_size=int(args["shard_size"])
            )
        else:
            raise ValueError(f"unknown serialization method {method!r}")
    except (ValueError, KeyError, TypeError) as error:
        raise _refuse(policy, f"unsupported hashing in the signed payload: {error}") from None
    ours = [p.name for p in tree.iterdir() if p.name.startswith(RESERVED_PREFIX)]
    signed_ignores = [str(p) for p in args.get("ignore_paths") or []]
    return config.set_ignored_paths(paths=[policy.path, *ours, *signed_ignores], ignore_git_paths=True)


def _signer(bundle: dict[str, Any], policy: SignaturePolicy) -> str:
    """Who signed, as recorded in the manifest: a key's hash, a certificate's subject, an identity."""
    if policy.method == "publicKey":
        # the library's own key id: sha256 of the key's PEM SubjectPublicKeyInfo (the bundle's hint)
        pem = serialization.load_pem_public_key(policy.public_key).public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return "key sha256:" + hashlib.sha256(pem).hexdigest()
    if policy.method == "sigstore":
        return f"{policy.identity} (issuer {policy.oidc_issuer})"
    material = bundle.get("verificationMaterial") or {}
    chain = (material.get("x509CertificateChain") or {}).get("certificates") or [material.get("certificate")]
    try:
        leaf = x509.load_der_x509_certificate(base64.b64decode(chain[0]["rawBytes"]))
    except (ValueError, KeyError, TypeError, IndexError):
        return "certificate (unreadable)"
    fingerprint = leaf.fingerprint(hashes.SHA256()).hex()
    return f"{leaf.subject.rfc4514_string()} (certificate sha256:{fingerprint})"


def _cause(error: Exception, tree: Path) -> tuple[str, str | None]:
    """The library's exception as one human line and its fix (None: the method's own)."""
    text = str(error).replace(f" in model '{tree.name}'", "")
    prefix = "Signature mismatch: "
    if text.startswith(prefix):
        try:
            diffs = ast.literal_eval(text[len(prefix) :])
            # a hash mismatch line carries both digests as Python reprs of raw bytes: keep the file
            lines = [str(d).split(": Expected ")[0] for d in diffs]
            return (
                "the files do not match the signed manifest: " + "; ".join(lines),
                "the model changed after it was signed: publish exactly the files signed, or sign it again",
            )
        except (ValueError, SyntaxError):
            pass
    name = type(error).__name__
    if name == "InvalidSignature":
        return "the signature does not verify with the trusted key (signed by another key, or altered)", None
    if name == "X509StoreContextError":
        return f"the signing certificate does not chain to the trusted CA certificates ({text})", None
    if text.startswith("Key mismatch"):
        return "signed by another key: the bundle's key hint is not the trusted public key's", None
    return f"{name}: {text}", None


def signed_paths(bundle: dict[str, Any]) -> set[str]:
    """The files the signed payload covers: its resources by name (a shard's name is
    `path:start:end`: model_signing/manifest.py `_Shard`)."""
    predicate = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))["predicate"]
    shards = predicate["serialization"].get("method") == "shards"
    resources = (str(r["name"]) for r in predicate.get("resources") or [])
    return {name.rsplit(":", 2)[0] if shards else name for name in resources}


def drop_unsigned(tree: Path, covered: set[str], policy: SignaturePolicy) -> list[str]:
    """Remove every file of `tree` the signature does not cover (but the bundle itself) and the
    folders left empty; the removed files' paths, sorted."""
    extras = []
    for walked, _dirs, files in os.walk(tree):
        base = os.path.relpath(walked, tree)
        for name in files:
            rel = name if base == "." else f"{base}/{name}"
            if rel not in covered and rel != policy.path and not rel.startswith(RESERVED_PREFIX):
                extras.append(rel)
    for rel in sorted(extras):
        (tree / rel).unlink()
        folder = (tree / rel).parent
        while folder != tree and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
    if extras:
        log.warning("not published: files the signature does not cover path=%s files=%s", policy.path, extras)
    return sorted(extras)


def verify_tree(tree: Path, policy: SignaturePolicy) -> dict[str, Any]:
    """Verify `policy`'s signature over `tree`, then drop what it does not cover (`drop_unsigned`);
    the manifest's record of it, or LastingDownloadError."""
    from model_signing import verifying

    signature = tree / policy.path
    bundle = _bundle(policy, signature)
    config = verifying.Config()  # type: ignore[no-untyped-call]  # its __init__ lacks -> None
    with tempfile.TemporaryDirectory(prefix="praesto-trust-") as scratch:
        try:
            if policy.method == "publicKey":
                key = Path(scratch) / "key.pub"
                key.write_bytes(policy.public_key)
                config.use_elliptic_key_verifier(public_key=key)
            elif policy.method == "certificate":
                chain = Path(scratch) / "chain.pem"
                chain.write_bytes(b"\n".join(c.strip() for c in policy.certificates) + b"\n")
                config.use_certificate_verifier(certificate_chain=[chain])
            elif policy.method == "sigstore":
                config.use_sigstore_verifier(identity=policy.identity, oidc_issuer=policy.oidc_issuer)
            else:
                raise ValueError(f"unknown method {policy.method!r}")
        except Exception as error:  # the library raises what its parsers raise
            if policy.method == "sigstore":  # keyless: the trust root comes from Sigstore's services
                raise TemporaryDownloadError(
                    "SourceUnavailable",
                    f"{policy.path}: keyless Sigstore verification could not load Sigstore's trust root "
                    f"({type(error).__name__}: {error}); the node needs to reach Sigstore's public "
                    "services, or use verification.signature.publicKey or .certificate",
                ) from None
            raise _refuse(
                policy,
                f"cannot use the {policy.method} trust material from {policy.origin}: "
                f"{type(error).__name__}: {error}",
                "give a PEM public key (EC P-256/P-384/P-521) or PEM CA certificates",
            ) from None
        config.set_hashing_config(_hashing_config(bundle, tree, policy))
        try:
            config.verify(tree, signature)
        except Exception as error:  # every failure of the library is a refusal here
            raise _refuse(policy, *_cause(error, tree)) from None
    record: dict[str, Any] = {
        "method": policy.method,
        "path": policy.path,
        "signer": _signer(bundle, policy),
        "trust": policy.trust,
        "trustFrom": policy.origin,
        "verifiedWith": LIBRARY,
    }
    excluded = drop_unsigned(tree, signed_paths(bundle), policy)
    if excluded:
        record[MANIFEST_SIGNATURE_EXCLUDED] = excluded
    log.info("signature verified path=%s method=%s signer=%s", policy.path, policy.method, record["signer"])
    return record


def policy_from_files(
    *,
    public_key: str | None = None,
    certificate: str | None = None,
    chain: tuple[str, ...] = (),
    identity: str | None = None,
    oidc_issuer: str | None = None,
    path: str | None = None,
) -> SignaturePolicy | None:
    """The CLI's `--signature-*` flags as a policy (None: no signature required); ValueError on misuse."""
    given = [
        m for m, on in (("publicKey", public_key), ("certificate", certificate), ("sigstore", identity)) if on
    ]
    if len(given) > 1:
        raise ValueError(
            "give one of --signature-public-key, --signature-certificate or --signature-identity, not several"
        )
    if chain and not certificate:
        raise ValueError("--signature-certificate-chain needs --signature-certificate (the CA it chains to)")
    if bool(identity) != bool(oidc_issuer):
        raise ValueError("--signature-identity and --signature-oidc-issuer go together (keyless Sigstore)")
    if not given:
        if path:
            raise ValueError("--signature-path needs a --signature-* trust flag (which signature to verify)")
        return None
    path = path or DEFAULT_SIGNATURE_FILE
    if path.startswith("/") or ".." in path.split("/"):
        raise ValueError(f"--signature-path {path}: give a path relative to the model's root, e.g. model.sig")

    def read(flag: str, name: str) -> bytes:
        try:
            return Path(name).read_bytes()
        except OSError as error:
            raise ValueError(f"{flag} {name}: {error.strerror}; give a readable PEM file") from None

    if public_key:
        return SignaturePolicy(
            "publicKey",
            path,
            f"--signature-public-key {public_key}",
            public_key=read("--signature-public-key", public_key),
        )
    if certificate:
        pems = (
            read("--signature-certificate", certificate),
            *(read("--signature-certificate-chain", c) for c in chain),
        )
        return SignaturePolicy(
            "certificate", path, f"--signature-certificate {certificate}", certificates=pems
        )
    return SignaturePolicy(
        "sigstore", path, "--signature-identity", identity=identity or "", oidc_issuer=oidc_issuer or ""
    )
