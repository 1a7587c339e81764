"""What praesto-hooks answers, before any thread sees a request, to one it will not read (pure:
tested without sockets). Every refusal is JSON `{"error": ...}` naming the limit and the fix."""

from __future__ import annotations

import json


class Refused(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def refusal_bytes(refusal: Refused) -> bytes:
    body = json.dumps({"error": refusal.message}).encode()
    lines = [
        f"HTTP/1.1 {refusal.status} {refusal.reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def body_length(head: bytes, limit: int) -> int:
    """The body length the head declares, or Refused (pure: tested without sockets)."""
    lengths: set[bytes] = set()
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == b"transfer-encoding":
            raise Refused(
                411, "Length Required", "chunked request bodies are not accepted; send Content-Length"
            )
        if key == b"content-length":
            lengths.add(value.strip())
    if not lengths:
        return 0
    (value,) = lengths if len(lengths) == 1 else (b"x",)
    if not value.isdigit() or len(value) > 18:
        raise Refused(400, "Bad Request", "Content-Length must be one decimal number")
    length = int(value)
    if length > limit:
        raise Refused(
            413,
            "Content Too Large",
            f"request body of {length} bytes is over this server's limit of {limit} bytes "
            "(praesto-hooks --max-request-bytes, chart value hooks.maxRequestBytes)",
        )
    return length
