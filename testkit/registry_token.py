"""A token service for the distribution registry's `token` auth, as its spec describes it.

https://distribution.github.io/distribution/spec/auth/token/ : the registry answers an
unauthenticated request with `401` and `WWW-Authenticate: Bearer realm=...,service=...,
scope=...`; the client asks the realm for a token (HTTP Basic for a user, nothing for
anonymous) and gets `{"token": JWT, "access_token": JWT, "expires_in": N}`. The JWT is what
distribution v3.1.2's `registry/auth/token` verifies (`token.go` `Verify`,
`VerifySigningKey`): an ES256 signature by the certificate in the `x5c` header, which must
chain to the registry's `rootcertbundle`; `iss` the configured issuer; `aud` the service;
`exp`/`nbf`; and `access` claims granting actions per repository. No registry project ships
such a service (Docker Hub's is its own), so this one is ours; it grants exactly what the
test configured and nothing else.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from testkit.pki import CertificateAuthority

ISSUER = "praesto-test-token-issuer"
SERVICE = "praesto-test-registry"


@dataclass
class Grants:
    """Who may do what: users (password, repository -> actions) and what anonymous callers get."""

    users: dict[str, tuple[str, dict[str, set[str]]]] = field(default_factory=dict)
    anonymous: dict[str, set[str]] = field(default_factory=dict)

    def allowed(self, user: str | None, repository: str) -> set[str]:
        granted = set(self.anonymous.get(repository, set()))
        if user is not None:
            granted |= self.users[user][1].get(repository, set())
        return granted


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenService:
    """The realm on 127.0.0.1; its signing certificate is issued by `ca`, whose certificate is
    the registry's `rootcertbundle`."""

    def __init__(
        self, workdir: Path, grants: Grants, *, lifetime: int = 300, tls: CertificateAuthority | None = None
    ) -> None:
        self.grants = grants
        self.lifetime = lifetime
        self.ca = CertificateAuthority(workdir / "token-ca", "token-ca")
        signer = self.ca.issue("token-signer", common_name="token-signer")
        self._key = serialization.load_pem_private_key(signer.key_path.read_bytes(), None)
        certificate = x509.load_pem_x509_certificate(signer.cert_path.read_bytes())
        self._x5c = [base64.b64encode(certificate.public_bytes(serialization.Encoding.DER)).decode()]
        self.issued: list[tuple[str | None, list[dict[str, object]]]] = []  # (user, access) per token
        self.refused = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                service._answer(self)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.tls = tls is not None
        if tls is not None:  # clients refuse a plain-HTTP realm for an HTTPS registry (oras does)
            pair = tls.issue("token-service", common_name="127.0.0.1", hosts=("127.0.0.1",))
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(pair.cert_path, pair.key_path)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def realm(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self._server.server_address[1]}/token"

    def __enter__(self) -> TokenService:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _user(self, header: str | None) -> str | bool | None:
        """The authenticated user, None for anonymous, False for a wrong password."""
        if not header:
            return None
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        user, _, password = base64.b64decode(value).decode().partition(":")
        known = self.grants.users.get(user)
        if known is None or not secrets.compare_digest(known[0], password):
            return False
        return user

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        query = parse_qs(urlsplit(request.path).query)
        user = self._user(request.headers.get("Authorization"))
        if user is False or query.get("service") != [SERVICE]:
            self.refused += 1
            request.send_response(401)
            request.send_header("Content-Length", "0")
            request.end_headers()
            return
        name = user if isinstance(user, str) else None
        access: list[dict[str, object]] = []
        for scope in query.get("scope", []):
            kind, _, rest = scope.partition(":")
            repository, _, actions = rest.rpartition(":")
            granted = sorted(set(actions.split(",")) & self.grants.allowed(name, repository))
            if kind == "repository" and granted:
                access.append({"type": "repository", "name": repository, "actions": granted})
        token = self._jwt(name, access)
        self.issued.append((name, access))
        body = json.dumps({"token": token, "access_token": token, "expires_in": self.lifetime}).encode()
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    def _jwt(self, user: str | None, access: list[dict[str, object]]) -> str:
        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256", "x5c": self._x5c}
        claims = {
            "iss": ISSUER, "sub": user or "", "aud": SERVICE, "exp": now + self.lifetime, "nbf": now - 1,
            "iat": now, "jti": secrets.token_hex(8), "access": access,
        }  # fmt: skip
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}".encode()
        assert isinstance(self._key, ec.EllipticCurvePrivateKey)
        r, s = decode_dss_signature(self._key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        return f"{signing_input.decode()}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"
