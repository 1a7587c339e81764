"""Throwaway X.509 material for tests: one CA, then server and client certificates it signs.

Kubernetes reads identities from client certificates (CN = user, O = groups), so
the control-plane tier issues the controller-manager's, the scheduler's and the
admin's from here; every TLS server the tests start gets its certificate here too.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LIFETIME = dt.timedelta(days=1)


@dataclass(frozen=True)
class KeyPair:
    cert_path: Path
    key_path: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _subject_alt_names(hosts: tuple[str, ...]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


class CertificateAuthority:
    """A self-signed CA written to `directory/<name>.crt`; `issue` signs leaf certificates."""

    def __init__(self, directory: Path, name: str = "praesto-test-ca") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        now = dt.datetime.now(dt.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = directory / f"{name}.crt"
        self.cert_path.write_bytes(self.pem)

    @property
    def pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        name: str,
        *,
        common_name: str,
        organizations: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        client: bool = False,
        code_signing: bool = False,
    ) -> KeyPair:
        """A leaf certificate: a server one for `hosts`, a client one naming a user and groups, or
        a code-signing one (signed models: testkit/signed_models.py)."""
        now = dt.datetime.now(dt.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        subject += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        usage = ExtendedKeyUsageOID.CODE_SIGNING if code_signing else usage
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + LIFETIME)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if hosts:
            builder = builder.add_extension(_subject_alt_names(hosts), critical=False)
        if code_signing:  # what a model-signing verifier looks for (sign_certificate.py)
            usage_bits = dict.fromkeys(
                ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
                 "key_cert_sign", "crl_sign", "encipher_only", "decipher_only"),
                False,
            )  # fmt: skip
            builder = builder.add_extension(
                x509.KeyUsage(digital_signature=True, **usage_bits), critical=True
            )
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key_path.write_bytes(_key_pem(key))
        pair.key_path.chmod(0o600)
        return pair


def signing_key(path: Path) -> KeyPair:
    """An EC key pair, e.g. the API server's ServiceAccount token signer: private key at `path`,
    public key (the verifier's `--service-account-key-file`) beside it as `.pub`."""
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(_key_pem(key))
    path.chmod(0o600)
    public = path.with_suffix(".pub")
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return KeyPair(cert_path=public, key_path=path)
