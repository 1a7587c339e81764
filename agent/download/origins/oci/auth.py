"""Registry credentials and the distribution token flow, for one repository.

What a registry asks for is in its 401's `WWW-Authenticate` (the distribution spec's
token auth, https://distribution.github.io/distribution/spec/auth/token/, as
`registry/auth/token` of distribution v3.1.2 checks it, and `Basic` for registries
behind htpasswd): `Bearer realm=...,service=...,scope=...` means "get a token from the
realm, with your credential if you have one"; `Basic` means "send your credential on
every request". The credential comes from a Docker config JSON (a
`kubernetes.io/dockerconfigjson` Secret's `.dockerconfigjson`), matched by registry
host the way Docker and containerd match it. Nothing here logs a credential or a token.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit

from praesto.agent.download.api import LastingDownloadError, TemporaryDownloadError
from praesto.agent.download.http import Transport, redact

from praesto import names
from praesto.quantity import format_bytes

_PARAM = re.compile(r'(\w+)="([^"]*)"')
# A token service answers a small JSON object (Docker Hub's is about 5 KiB with its JWT); a realm is
# any URL a tenant's registry names, so its answer is read only up to this, never whole.
MAX_TOKEN_ANSWER_BYTES = 64 << 10
DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")


@dataclass(frozen=True)
class Credential:
    """A registry login: a user and password, or an identity (refresh) token."""

    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    origin: str = ""  # where it came from, for messages ("Secret team/regcred")


def credential_for(host: str, credentials: Mapping[str, str] | None, origin: str) -> Credential | None:
    """The login a Docker config JSON holds for `host`, if any.

    Keys are matched as Docker matches them: the bare host, or a URL whose host is it
    (`https://host/v1/`); Docker Hub's several names are one.
    """
    text = (credentials or {}).get(names.DOCKER_CONFIG_KEY, "")
    if not text:
        return None
    try:
        auths = json.loads(text).get("auths", {})
    except (ValueError, AttributeError):
        raise LastingDownloadError(
            "Unauthorized",
            f"{origin}: {names.DOCKER_CONFIG_KEY} is not a Docker config JSON; create the Secret with "
            "kubectl create secret docker-registry",
        ) from None
    wanted = {host} | (set(DOCKER_HUB_KEYS) if host in DOCKER_HUB_KEYS else set())
    for key, entry in auths.items() if isinstance(auths, dict) else ():
        bare = urlsplit(key).netloc if "://" in key else key.split("/", 1)[0]
        if (key in wanted or bare in wanted) and isinstance(entry, dict):
            return _credential(entry, origin, host)
    return None


def _credential(entry: Mapping[str, object], origin: str, host: str) -> Credential:
    username, password = str(entry.get("username") or ""), str(entry.get("password") or "")
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            username, _, password = base64.b64decode(auth, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise LastingDownloadError(
                "Unauthorized", f"{origin}: the auth entry for {host} is not base64 of user:password"
            ) from None
    return Credential(username, password, str(entry.get("identitytoken") or ""), origin)


def challenge_of(header: str) -> tuple[str, dict[str, str]]:
    """(scheme, parameters) of a `WWW-Authenticate` value."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(_PARAM.findall(rest))


class RegistryAuth:
    """The `Authorization` a registry wants for one repository, obtained on its first 401.

    Shared by the download's threads; `answer` is serialised, so a token that expires
    mid-download is fetched again once, not once per thread.
    """

    def __init__(self, transport: Transport, repository: str, credential: Credential | None) -> None:
        self.transport = transport
        self.repository = repository
        self.credential = credential
        self._header = ""
        self._lock = threading.Lock()

    @property
    def header(self) -> str:
        return self._header

    def answer(self, challenge: str, refused: str) -> bool:
        """Obtain what `challenge` asks for; False when there is nothing new to try.

        `refused` is the header the 401 was answered to: another thread may have renewed
        it meanwhile, and then that renewal is used as it is.
        """
        with self._lock:
            if self._header != refused:
                return True
            scheme, params = challenge_of(challenge)
            if scheme == "basic":
                if self.credential is None or not self.credential.username:
                    return False
                if self._header:  # the credential itself was refused
                    raise self._refused("the registry refused the user and password")
                login = f"{self.credential.username}:{self.credential.password}".encode()
                self._header = "Basic " + base64.b64encode(login).decode()
                return True
            if scheme == "bearer" and params.get("realm"):
                self._header = "Bearer " + self._token(params)
                return True
            return False

    def _token(self, params: Mapping[str, str]) -> str:
        query = {"service": params.get("service", "")} if params.get("service") else {}
        scope = params.get("scope") or f"repository:{self.repository}:pull"
        realm = params["realm"]
        if not realm.startswith(("https://", "http://")):
            raise self._refused(f"the token realm {realm!r} is not an http(s) URL")
        cred = self.credential
        headers = {}
        if cred is not None and cred.username:
            login = f"{cred.username}:{cred.password}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(login).decode()
        if cred is not None and cred.identity_token:  # OAuth2 refresh token (docker login --identity-token)
            body = urlencode({**query, "scope": scope, "grant_type": "refresh_token", "client_id": "praesto",
                              "refresh_token": cred.identity_token})  # fmt: skip
            form = {"Content-Type": "application/x-www-form-urlencoded"}
            resp = self.transport.request("POST", realm, authorized=False, headers=form, body=body.encode())
        else:
            url = f"{realm}{'&' if '?' in realm else '?'}{urlencode({**query, 'scope': scope})}"
            resp = self.transport.request("GET", url, authorized=False, headers=headers)
        data = resp.read(MAX_TOKEN_ANSWER_BYTES + 1)
        if len(data) > MAX_TOKEN_ANSWER_BYTES:
            self.transport.close()  # the rest of that answer is still on the connection
            raise LastingDownloadError(
                "SourceUnavailable",
                f"the token service {redact(realm)} answered more than {format_bytes(MAX_TOKEN_ANSWER_BYTES)}, "
                "which is no token answer; check the registry's token realm",
            )
        if resp.status in (401, 403):
            if cred is None:
                raise LastingDownloadError(
                    "WaitingForCredentials",
                    f"{redact(realm)} gives no anonymous token for {self.repository}; set spec.source.secretRef "
                    "to a kubernetes.io/dockerconfigjson Secret (or --registry-config for the CLI)",
                )
            raise self._refused(f"the token service {redact(realm)} answered HTTP {resp.status}")
        if resp.status == 429 or resp.status >= 500:
            raise TemporaryDownloadError(
                "SourceUnavailable", f"the token service {redact(realm)} answered HTTP {resp.status}"
            )
        try:
            answer = json.loads(data)
            token = answer.get("token") or answer.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise LastingDownloadError(
                "SourceUnavailable", f"the token service {redact(realm)} answered without a token"
            )
        return token

    def _refused(self, cause: str) -> LastingDownloadError:
        where = self.credential.origin if self.credential else "no credential"
        return LastingDownloadError(
            "Unauthorized",
            f"{self.repository}: {cause} (credential from {where}); check the user, password and their "
            "pull access to this repository",
        )
