"""Structured logs: one JSON object per line, cache namespace/name on every cache line.

Why JSON: node logs are shipped to aggregators that index fields; `grep` still
works. Nothing here ever receives a token: callers log names, never values.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import MutableMapping
from typing import IO, Any

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED})
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, sort_keys=False)


def configure(level: str = "INFO", stream: IO[str] | None = None) -> None:
    """Send every `praesto` logger to `stream` as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("praesto")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


class _Fields(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def logger(name: str, **fields: Any) -> logging.LoggerAdapter[logging.Logger]:
    """A logger whose every line carries `fields` (e.g. namespace=, cache=, node=)."""
    return _Fields(logging.getLogger(name), fields)


def cache_logger(namespace: str, cache: str, **fields: Any) -> logging.LoggerAdapter[logging.Logger]:
    return logger("praesto.agent", namespace=namespace, cache=cache, **fields)
