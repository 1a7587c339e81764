"""The one error a Xet format check raises: its message names the cause (which chunk, which range)."""

from __future__ import annotations


class XetFormatError(ValueError):
    """What a CAS served breaks the Xet format or its hashes; nothing of it may be trusted."""
