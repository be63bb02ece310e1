"""Audit reads are rate-limited per asker (issue 8): each `history`, `get --at` and `watch`
page replays the log from the newest snapshot, so one asker in a loop kept the read service
busy for all. Past its bucket an asker is refused as kube-apiserver refuses (429,
`TooManyRequests`, when to ask again), counted and logged; others, and reads of the read
model as it stands, are not held up."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.aio.client import Client as Nats
from structlog.testing import capture_logs

from controlplane.user.client import Client
from controlplane.writer import Writer
from events.api.errors import InvalidSpec
from events.jetstream.connect import connect
from events.jetstream.streams import ensure_all
from events.language.messages import Command
from events.language.query import (
    TOO_MANY_REQUESTS,
    Answer,
    HistoryAnswer,
    HistoryQuery,
    Query,
    WatchAnswer,
    WatchQuery,
    ask_verb,
)
from events.language.subjects import Layout
from projections.ratelimit import AskerLimits, AuditLimit
from projections.service import QUERIES_REFUSED, RATE_LIMITED, ReadService
from tests.system.harness import eventually, vm_manifest

BURST = 3
LIMIT = AuditLimit(per_second=1e-6, burst=BURST)
"""A bucket that refills nothing while a test runs: exactly `BURST` audit reads each."""
WEB = HistoryQuery(kind="VirtualMachine", namespace="default", name="web")


class Reads:
    def __init__(self, nc: Nats, layout: Layout, service: ReadService, applied: int) -> None:
        self.nc, self.layout, self.service, self.applied = nc, layout, service, applied

    async def history(self, asker: str) -> HistoryAnswer:
        return await ask_verb(self.nc, self.layout, asker, "history", WEB,
                              answer=HistoryAnswer)

    async def now(self) -> Answer:
        """alice's `get` of the read model as it stands, once it holds the apply."""
        return await ask_verb(self.nc, self.layout, "alice", "get",
                              Query(kind="VirtualMachine", after=self.applied), answer=Answer)

    def refused(self) -> float:
        return self.service.registry.get_sample_value(
            f"{QUERIES_REFUSED}_total", {"reason": RATE_LIMITED}) or 0.0


@pytest.fixture
async def reads(nats_url: str, prefix: str, request: pytest.FixtureRequest
                ) -> AsyncIterator[Reads]:
    """The read service with `LIMIT` (or the limit the test names), past one apply."""
    limit: AuditLimit = getattr(request, "param", LIMIT)
    layout = Layout(prefix)
    nc = await connect(nats_url, "test")
    await ensure_all(nc.jetstream(), layout)
    command = Command(id=str(uuid.uuid4()), actor="alice", kind="VirtualMachine",
                      verb="apply", manifest=vm_manifest("web", "Halted"))
    applied = await Writer(nc, layout).execute(command)
    assert applied.outcome.accepted, applied.outcome.reason
    service = ReadService(nc, layout, audit_limit=limit)
    stop = asyncio.Event()
    task = asyncio.ensure_future(service.run(stop))
    out = Reads(nc, layout, service, applied.outcome.sequences[-1])
    try:
        await eventually(out.now, what="the read service, past the apply")
        yield out
    finally:
        stop.set()
        await task
        await nc.close()


async def test_an_asker_past_its_audit_reads_waits(reads: Reads) -> None:
    for _ in range(BURST):
        answered = await reads.history("alice")
        assert answered.error == "" and answered.entries
    with capture_logs() as logs:
        refused = await reads.history("alice")
        at = await ask_verb(reads.nc, reads.layout, "alice", "get",
                            Query(kind="VirtualMachine", at=reads.applied), answer=Answer)
        page = await ask_verb(reads.nc, reads.layout, "alice", "watch",
                              WatchQuery(kind="VirtualMachine", since=1), answer=WatchAnswer)
    for answer in (refused, at, page):
        assert answer.reason == TOO_MANY_REQUESTS
        assert answer.error == "Too many requests, please try again later."
        assert answer.retry_after_seconds >= 1
    assert not refused.entries and not at.items and not page.changes
    assert reads.refused() == 3
    assert [(e["event"], e["reason"], e["asker"]) for e in logs
            if e.get("reason") == RATE_LIMITED] == [("refused a read", RATE_LIMITED, "alice")] * 3

    # Another asker has a bucket of its own; the read model now costs no replay.
    assert (await reads.history("bob")).entries
    now = await reads.now()
    assert now.error == "" and [i["metadata"]["name"] for i in now.items] == ["web"]
    assert reads.refused() == 3


@pytest.mark.parametrize("reads", [AuditLimit(per_second=0.25, burst=1)], indirect=True)
async def test_the_client_asks_again_when_told(reads: Reads, nats_url: str,
                                               prefix: str) -> None:
    """As client-go on a 429: the second history waits the seconds the refusal names (4)
    and is answered."""
    async with await Client.connect(nats_url, prefix, actor="carol") as carol:
        first = await carol.history("VirtualMachine", "default", "web")
        assert await carol.history("VirtualMachine", "default", "web") == first
    assert reads.refused() == 1


def test_a_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    limits = AskerLimits(AuditLimit(per_second=2.0, burst=2), clock=lambda: now[0])
    assert [limits.take("alice") for _ in range(3)] == [0.0, 0.0, 0.5]
    now[0] = 0.25
    assert limits.take("alice") == 0.25  # half a token back: a quarter second to go
    now[0] = 0.5
    assert limits.take("alice") == 0.0
    now[0] = 100.0
    assert [limits.take("alice") for _ in range(3)] == [0.0, 0.0, 0.5]  # never past burst


@pytest.mark.parametrize(("flag", "value", "field"), [
    ("--audit-reads-per-second", "0", "--audit-reads-per-second"),
    ("--audit-reads-per-second", "nan", "--audit-reads-per-second"),
    ("--audit-reads-burst", "0", "--audit-reads-burst"),
])
def test_a_limit_that_admits_nothing_is_refused(flag: str, value: str, field: str) -> None:
    with pytest.raises(InvalidSpec, match=f"^{field}: "):
        AuditLimit(**{flag.removeprefix("--audit-reads-").replace("-", "_"): float(value)})
    run = subprocess.run([sys.executable, "-m", "projections", "run", flag, value],
                         capture_output=True, text=True, timeout=60, check=False)
    assert (run.returncode, run.stderr.startswith(f"error: {field}: ")) == (2, True), run.stderr


def test_answers_say_when_to_ask_again() -> None:
    """The field is on the wire: an older answer without it decodes as 0."""
    old = msgspec.msgpack.encode({"entries": [], "error": "x", "reason": ""})
    assert msgspec.msgpack.decode(old, type=HistoryAnswer).retry_after_seconds == 0
