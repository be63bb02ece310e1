"""Group commit on a real nats-server: members that are ready together share one atomic
batch, and a group refused for one member's expectation is split, not sent member by member."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from events.jetstream.connect import connect
from events.jetstream.datastore import AppendConflict, EventLog, Outgoing
from events.jetstream.groupcommit import GroupCommit
from events.jetstream.streams import ensure_all
from events.language.subjects import Layout


class CountingLog(EventLog):
    """The real log, counting the commits it sends."""

    commits = 0

    async def publish(self, messages: Sequence[Outgoing]) -> list[int]:
        self.commits += 1
        return await super().publish(messages)


@pytest.fixture
async def log(nats_url: str, prefix: str) -> AsyncIterator[CountingLog]:
    layout = Layout(prefix)
    nc = await connect(nats_url, "group-commit")
    await ensure_all(nc.jetstream(), layout)
    try:
        yield CountingLog(nc, layout)
    finally:
        await nc.close()


def member(log: EventLog, n: int, expect: int | None = 0) -> list[Outgoing]:
    """Two messages on a subject of their own, the first expecting it `expect`."""
    subject = log.layout.aggregate_subject(f"vm.default.m{n}")
    return [Outgoing(subject, b"a", {}, expect), Outgoing(subject, b"b", {})]


async def test_one_refused_member_splits_its_group_and_only_it_is_refused(
        log: CountingLog) -> None:
    commits = GroupCommit(log)
    size = 33  # all waiting when the first commit starts: one group
    results = await asyncio.gather(
        *(commits.publish(member(log, n, expect=7 if n == 20 else 0)) for n in range(size)),
        return_exceptions=True)
    refused = [n for n, r in enumerate(results) if isinstance(r, BaseException)]
    assert refused == [20]
    assert isinstance(results[20], AppendConflict)
    stored = sorted(seq for r in results if isinstance(r, list) for seq in r)
    assert len(stored) == 2 * (size - 1) and len(set(stored)) == len(stored)
    # The group, then two halves a level down to the refused member: 1 + 2 * 6 at most;
    # member by member it would be 1 + 33.
    assert log.commits <= 13, log.commits
