"""OCI references (`registry.example.com/team/llama:1.0`, `...@sha256:<hex>`), parsed once.

The grammar is the distribution project's (`github.com/distribution/reference`,
`regexp.go` at v0.6.0): a registry host (a dotted name, `localhost`, or an IP, with an
optional port), then slash-separated lowercase path components, then `:tag` or
`@algorithm:hex`. Unlike `docker pull`, the registry host is required: a model cache
must never guess that `team/llama` means Docker Hub. Only sha256 digests are accepted:
it is what the content-addressed store and the peers verify.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

_HOST_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = re.compile(rf"^(?:{_HOST_COMPONENT}(?:\.{_HOST_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]{{1,5}})?$")
_PATH_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
DEFAULT_TAG = "latest"
SCHEME = "oci"
# Docker Hub's API host is not its name (containerd's docker resolver maps it the same way).
API_HOSTS = {"docker.io": "registry-1.docker.io", "index.docker.io": "registry-1.docker.io"}
LOOPBACK_NAMES = ("localhost",)


class ReferenceError(ValueError):
    """A reference that cannot name an artifact: the message says which part and the fix."""


@dataclass(frozen=True)
class Reference:
    host: str  # registry host[:port], as written
    repository: str  # team/llama
    tag: str = ""  # 1.0 (empty when pinned by digest only)
    digest: str = ""  # sha256:<hex>

    @property
    def location(self) -> str:
        """host/repository: what `Source.location` holds for an OCI source."""
        return f"{self.host}/{self.repository}"

    @property
    def revision(self) -> str:
        """What is pulled: the digest when given (it wins over a tag), else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    @property
    def api_host(self) -> str:
        return API_HOSTS.get(self.host, self.host)

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.location}{tag}{digest}"


def is_loopback(host: str) -> bool:
    """Whether `host[:port]` names this machine: the only place plain HTTP is ever spoken."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    name = name.strip("[]")
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def parse_reference(text: str) -> Reference:
    """`host[:port]/repo[:tag][@sha256:hex]` or raise `ReferenceError` naming what is wrong."""
    if not isinstance(text, str) or not text or len(text) > 2048:
        raise ReferenceError("must be a reference such as registry.example.com/team/model:1.0")
    rest, _, digest = text.partition("@")
    if digest and not DIGEST.match(digest):
        raise ReferenceError(f"digest {digest!r} is not sha256:<64 lowercase hex>; copy it from the registry")
    host, slash, path = rest.partition("/")
    if not slash or not path:
        raise ReferenceError(
            f"{text!r} names no repository; write registry-host/repository[:tag], e.g. ghcr.io/team/model:1.0"
        )
    if not _HOST.match(host) or ("." not in host and ":" not in host and host not in LOOPBACK_NAMES):
        raise ReferenceError(
            f"{host!r} is not a registry host; the reference must start with the registry, "
            "e.g. docker.io/team/model or registry.example.com:5000/team/model"
        )
    last = path.rsplit("/", 1)[-1]
    tag = ""
    if ":" in last:
        path, _, tag = path.rpartition(":")
        if not _TAG.match(tag):
            raise ReferenceError(
                f"tag {tag!r} is not valid; use letters, digits, '_', '.', '-' (128 at most)"
            )
    for component in path.split("/"):
        if not _PATH_COMPONENT.match(component):
            raise ReferenceError(
                f"repository component {component!r} is not valid; use lowercase letters, digits and "
                "single separators ('.', '_', '__', '-')"
            )
    if len(path) > 255:
        raise ReferenceError("the repository name is longer than 255 characters")
    return Reference(host, path, tag, digest)


def reference_of(location: str, revision: str) -> Reference:
    """The reference a `Source` (location host/repo, revision tag or digest) pulls."""
    if DIGEST.match(revision):
        return parse_reference(f"{location}@{revision}")
    return parse_reference(f"{location}:{revision}" if revision else location)
