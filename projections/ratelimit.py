"""How often each asker may make the read service replay the log.

An audit read (`history`, `get --at`, a `watch` page) rebuilds what it answers from the
newest snapshot and the log after it, so one person asking in a loop keeps the read service
busy for everyone. Each asker has a token bucket: `burst` reads at once, refilled at
`per_second`; a read past it is refused as kube-apiserver refuses one (429, reason
`TooManyRequests`, with the seconds to wait), counted and logged by the read service. Reads
of the read model as it stands now cost no replay and are not limited.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable
from typing import Final

import msgspec

from events.api.errors import InvalidSpec

AUDIT_READS_PER_SECOND: Final = 5.0
"""Audit reads each asker may make per second, sustained."""
AUDIT_READS_BURST: Final = 20
"""Audit reads each asker may make at once (a `watch` catching up, a few `history` calls)."""
PER_SECOND_ENV: Final = "VIRTBUS_AUDIT_READS_PER_SECOND"
BURST_ENV: Final = "VIRTBUS_AUDIT_READS_BURST"
TRACKED_ASKERS: Final = 10_000
"""Buckets kept before full ones (as good as new) are dropped: in an open installation any
name may ask."""


class AuditLimit(msgspec.Struct, frozen=True, kw_only=True):
    per_second: float = AUDIT_READS_PER_SECOND
    burst: int = AUDIT_READS_BURST

    def __post_init__(self) -> None:
        if not (math.isfinite(self.per_second) and self.per_second > 0):
            raise InvalidSpec("--audit-reads-per-second", "must be a number above 0, not "
                              f"{self.per_second}")
        if self.burst < 1:
            raise InvalidSpec("--audit-reads-burst", f"must be 1 or more, not {self.burst}")


class _Bucket:
    __slots__ = ("at", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens, self.at = tokens, at


class AskerLimits:
    """One token bucket per asker."""

    def __init__(self, limit: AuditLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.clock = limit, clock
        self.buckets: dict[str, _Bucket] = {}

    def take(self, asker: str) -> float:
        """Take one of `asker`'s tokens: 0.0 if it had one, else the seconds until it will."""
        now, limit = self.clock(), self.limit
        bucket = self.buckets.get(asker)
        if bucket is None:
            if len(self.buckets) >= TRACKED_ASKERS:
                self._forget_full(now)
            bucket = self.buckets[asker] = _Bucket(limit.burst, now)
        bucket.tokens = min(limit.burst, bucket.tokens + (now - bucket.at) * limit.per_second)
        bucket.at = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / limit.per_second

    def _forget_full(self, now: float) -> None:
        limit = self.limit
        self.buckets = {asker: b for asker, b in self.buckets.items()
                        if b.tokens + (now - b.at) * limit.per_second < limit.burst}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--audit-reads-per-second` and `--audit-reads-burst`, defaulting to their environment
    variables, else to `AUDIT_READS_PER_SECOND` and `AUDIT_READS_BURST` (argparse parses a
    string default as it parses the flag, so a malformed variable is its usage error)."""
    parser.add_argument("--audit-reads-per-second", type=float,
                        default=os.environ.get(PER_SECOND_ENV, str(AUDIT_READS_PER_SECOND)),
                        help="history / get --at / watch pages each asker may ask per second "
                             f"(env {PER_SECOND_ENV}, default {AUDIT_READS_PER_SECOND})")
    parser.add_argument("--audit-reads-burst", type=int,
                        default=os.environ.get(BURST_ENV, str(AUDIT_READS_BURST)),
                        help="... and at once (env "
                             f"{BURST_ENV}, default {AUDIT_READS_BURST})")


def limit_from_args(args: argparse.Namespace) -> AuditLimit:
    return AuditLimit(per_second=args.audit_reads_per_second, burst=args.audit_reads_burst)
