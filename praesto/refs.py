"""What every part of a ModelCache spec refuses with, and how it names a Secret (praesto/spec.py,
praesto/verification.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


@dataclass(frozen=True)
class SpecError:
    """One refusal: which field, what is wrong, how to fix it."""

    field: str
    cause: str
    fix: str
    value: Any = None

    def __str__(self) -> str:
        shown = f": Invalid value: {self.value!r}" if self.value is not None else ""
        return f"{self.field}{shown}: {self.cause}; {self.fix}"


@dataclass(frozen=True)
class SecretRef:
    """A Secret in the cache's namespace; `key` is None for credential Secrets with standard keys."""

    name: str
    key: str | None = None


def check_secret_name(name: Any, field_path: str, kind: str = "Secret") -> list[SpecError]:
    """A Secret's (or a ConfigMap's: the same DNS-subdomain rule) name."""
    if isinstance(name, str) and len(name) <= 253 and SECRET_NAME.match(name):
        return []
    return [
        SpecError(
            field_path,
            f"is not a valid {kind} name",
            "use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
            name,
        )
    ]
