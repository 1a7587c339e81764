"""Resume journal: which parts (and whole verified files) are durably on disk in staging.

An append-only JSON-lines file. A line is only written after the data it describes
was fsync'd, and the journal itself is fsync'd, so after SIGKILL or a reboot every
journaled part can be trusted not to be torn. The first line pins what the staging
belongs to (revision, part size); a mismatch means the staging is thrown away.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOURNAL = ".praesto-journal"


@dataclass
class Resumed:
    parts: dict[str, set[int]] = field(default_factory=dict)  # path -> part indices
    verified: dict[str, str] = field(default_factory=dict)  # path -> sha256


class Journal:
    def __init__(self, staging: Path, header: dict[str, Any]) -> None:
        self.path = staging / JOURNAL
        self.header = header
        self._lock = threading.Lock()
        self._fd: int | None = None

    def load(self) -> Resumed | None:
        """What an earlier run left, or None when the staging is not ours to reuse."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return None
        out = Resumed()
        for number, line in enumerate(lines):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                break  # a torn last line: everything before it holds
            if number == 0:
                if entry != self.header:
                    return None
                continue
            if "parts" in entry:
                out.parts.setdefault(entry["path"], set()).update(int(i) for i in entry["parts"])
            elif "sha256" in entry:
                out.verified[entry["path"]] = entry["sha256"]
            elif entry.get("reset"):
                out.parts.pop(entry["path"], None)
                out.verified.pop(entry["path"], None)
        return out if lines else None

    def open(self, fresh: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if fresh else 0)
        self._fd = os.open(self.path, flags, 0o644)
        if fresh:
            self._append([self.header])

    def _append(self, entries: list[dict[str, Any]]) -> None:
        if self._fd is None or not entries:
            return
        data = "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries).encode()
        with self._lock:
            os.write(self._fd, data)
            os.fsync(self._fd)

    def parts_done(self, path: str, parts: list[int]) -> None:
        self._append([{"path": path, "parts": sorted(parts)}])

    def verified(self, entries: list[tuple[str, str]]) -> None:
        self._append([{"path": p, "sha256": h} for p, h in entries])

    def reset(self, path: str) -> None:
        self._append([{"path": path, "reset": True}])

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
