"""Kubernetes quantities, Go-style durations and human byte sizes."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "m": Decimal("0.001"),
}
_QUANTITY = re.compile(
    r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[kMGTPEm])?)$"
)
QUANTITY_PATTERN = _QUANTITY.pattern

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h|d)")
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h|d))+$"


class QuantityError(ValueError):
    pass


def parse_quantity(text: str | int) -> int:
    """Bytes in a Kubernetes quantity such as `5Gi`, `500M` or `1e9` (rounded up)."""
    if isinstance(text, bool):
        raise QuantityError(f"{text!r} is not a quantity")
    if isinstance(text, int):
        return text
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise QuantityError(f"{text!r} is not a quantity (examples: 5Gi, 500Mi, 2G)")
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number)
        value *= Decimal(10) ** int(exponent[1:]) if exponent else _SUFFIXES[suffix or ""]
    except (InvalidOperation, ValueError) as err:
        raise QuantityError(f"{text!r} is not a quantity") from err
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration (`90m`, `24h`, `1h30m`), plus `d` for days."""
    text = str(text).strip()
    if not text or not re.match(DURATION_PATTERN, text):
        raise QuantityError(f"{text!r} is not a duration (examples: 30m, 24h, 7d, 1h30m)")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(text))


def format_bytes(count: float) -> str:
    """Human size in binary units: 4.1 GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
