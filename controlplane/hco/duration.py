"""Go `time.ParseDuration` / `Duration.String` for the HCO fields that carry durations.

HCO (and KubeVirt, CDI, CNAO) store durations as Go strings (`48h0m0s`, `1h`, `10m`); we must
accept exactly what Go accepts and write what Go writes, or a round trip through an operand
would register as drift.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_TERM = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> timedelta:
    """Parse a Go duration string; `ValueError` names the text when Go would refuse it."""
    sign = -1 if text.startswith("-") else 1
    body = text[1:] if text[:1] in ("+", "-") else text
    if body == "0":
        return timedelta(0)
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total_ns = Decimal(0)
    pos = 0
    while pos < len(body):
        match = _TERM.match(body, pos)
        if match is None:
            raise ValueError(f"invalid duration {text!r}")
        total_ns += Decimal(match.group(1)) * _UNIT_NS[match.group(2)]
        pos = match.end()
    return timedelta(microseconds=int(sign * total_ns / 1_000))


def format_go_duration(value: timedelta) -> str:
    """Write a duration as Go's `Duration.String` does: `48h0m0s`, `1m30s`, `500ms`, `0s`."""
    total_us = round(value.total_seconds() * 1_000_000)
    if total_us == 0:
        return "0s"
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    if total_us < 1_000_000:
        unit, scale = ("ms", 1_000) if total_us >= 1_000 else ("µs", 1)
        return sign + _decimal(Decimal(total_us) / scale) + unit
    hours, rest = divmod(total_us, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds = _decimal(Decimal(rest) / 1_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return sign + seconds


def _decimal(value: Decimal) -> str:
    text = f"{value:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
