"""The checks every hub form of spec.source shares: a git revision, file patterns, a token Secret.

The kind table (praesto/kinds.py) builds each hub's parsers from these, so the Hub and ModelScope
refuse alike; each refusal names the field, the cause and the fix.
"""

from __future__ import annotations

import re
from typing import Any

from praesto import names
from praesto.refs import SECRET_KEY, SecretRef, SpecError, check_secret_name

# allowPatterns / ignorePatterns (the CRDs' maxItems and maxLength): every listed file is matched
# against every pattern, so a plan's file cap (agent/download/api.py MAX_FILES) times these bounds
# is the most matching a copy's plan does; a real list holds a few, each far shorter.
MAX_PATTERNS = 32
MAX_PATTERN_CHARS = 256


def check_revision(revision: Any, field_path: str, branch: str = names.DEFAULT_REVISION) -> list[SpecError]:
    """A git ref (branch, tag or commit) as the Hub and ModelScope name revisions."""
    ok = (
        isinstance(revision, str)
        and 0 < len(revision) <= 255
        and not revision.startswith(("/", "-", "."))
        and not revision.endswith(("/", ".lock", "."))
        and ".." not in revision
        and "//" not in revision
        and "@{" not in revision
        and not re.search(r"[\x00-\x20~^:?*\[\\\x7f]", revision)
    )
    if ok:
        return []
    fix = f"use a branch such as {branch}, a tag, or a 40-hex commit"
    return [SpecError(field_path, "is not a valid git branch, tag or commit", fix, revision)]


def check_patterns(value: Any, field_path: str) -> tuple[tuple[str, ...], list[SpecError]]:
    if value is None:
        return (), []
    if not isinstance(value, list) or not all(isinstance(p, str) and p and "\x00" not in p for p in value):
        return (), [
            SpecError(
                field_path, "must be a list of non-empty glob patterns", 'e.g. ["*.json", "*.safetensors"]'
            )
        ]
    if len(value) > MAX_PATTERNS or any(len(p) > MAX_PATTERN_CHARS for p in value):
        return (), [
            SpecError(
                field_path,
                f"holds at most {MAX_PATTERNS} patterns of at most {MAX_PATTERN_CHARS} characters each",
                "match several files with one pattern (e.g. *.safetensors, or a folder/)",
            )
        ]
    return tuple(value), []


def token_ref(token: Any, base: str, key_example: str, errors: list[SpecError]) -> SecretRef | None:
    """`<form>.token.secretRef`: name and key together."""
    ref = token.get("secretRef") if isinstance(token, dict) else None
    if not isinstance(ref, dict):
        errors.append(
            SpecError(f"{base}.token.secretRef", "Required value", "set secretRef.name and secretRef.key")
        )
        return None
    name, key = ref.get("name"), ref.get("key")
    if not name or not key:
        errors.append(
            SpecError(
                f"{base}.token.secretRef.{'name' if not name else 'key'}",
                "secretRef.name and secretRef.key must be configured together",
                "set both the Secret's name and the key that holds the token",
            )
        )
        return None
    errors.extend(check_secret_name(name, f"{base}.token.secretRef.name"))
    if not isinstance(key, str) or not SECRET_KEY.match(key):
        errors.append(
            SpecError(f"{base}.token.secretRef.key", "is not a valid Secret key", f"e.g. {key_example}", key)
        )
        return None
    return SecretRef(name, key)
