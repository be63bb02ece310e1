"""The agent's record of node work applied, so a work item is done once however often it
is delivered, and a finished VMI never comes back.

The node stream drops a re-published work item only inside its duplicate window (the
dispatcher's `Nats-Msg-Id` is the event id); a dispatcher replaying from an old checkpoint
publishes it again past the window. So the agent keeps its own record, in the
installation's applied-work KV bucket (`Layout.applied_bucket`), under its own node's keys:

| key                      | put                                     | and then                  |
|--------------------------|-----------------------------------------|---------------------------|
| `<node>.work.<event id>` | a work item's outcome was reported      | that event id is acked,   |
|                          | (before its ack)                        | nothing done again        |
| `<node>.vmi.<uid>`       | the VMI is about to be reported         | a launch of that uid does |
|                          | Succeeded or Failed, or its domain was  | nothing                   |
|                          | removed as no active VMI's              |                           |
| `<node>.migrations`      | a migration to or from this node is     | a restarted agent knows   |
|                          | prepared, started, converged, finished, | what it was migrating     |
|                          | cleaned up or aborted                   | (`MigrationBook`)         |

The migrations are one key, read whole at start: an agent may read its own keys but not list
them.

A bucket rather than a file beside the host: it is there for every libvirt URI (a real host
has no `--sim-state`, the in-memory test host no file), is replicated like the streams it
guards, goes with the installation, and keys under `<node>.` let permissions pin each agent to
its own. Entries have no TTL: any window would be one more that a replay can outlast.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from events.language.messages import MigrationOrder, NodeCommand
from events.language.subjects import Layout, encode_token
from nodeagent.defaults import WORKLOG_POLL_SECONDS


class AppliedWork(msgspec.Struct, frozen=True, kw_only=True):
    """A work item done here: which VMI, what, for which command (for whoever inspects)."""

    uid: str
    verb: str
    command_id: str = ""


class FinishedVMI(msgspec.Struct, frozen=True, kw_only=True):
    """A VMI that finished here; `reason` as reported, for whoever inspects."""

    reason: str


class OutgoingMigration(msgspec.Struct, frozen=True, kw_only=True):
    """A migration this node is the source of, recorded before its transfer starts."""

    order: MigrationOrder
    namespace: str
    name: str
    event_id: str
    """The `migrate` work item's: marked applied when a restart fails the transfer, so a
    redelivery of it starts none."""
    converged: bool = False
    """Ready to switch over; kept until migrate-cleanup or migrate-abort."""


class IncomingMigration(msgspec.Struct, frozen=True, kw_only=True):
    """A migration this node is the target of, recorded once prepared."""

    order: MigrationOrder
    vmi: dict[str, Any]
    """The VMI as prepared: what migrate-finish (or a restart's reconcile) starts."""


class MigrationBook(msgspec.Struct, kw_only=True):
    """Every migration this node is part of, by VMI uid (a VMI migrates once at a time)."""

    outgoing: dict[str, OutgoingMigration] = {}
    incoming: dict[str, IncomingMigration] = {}


class WorkLog:
    """One node's keys in the applied-work bucket."""

    def __init__(self, kv: KeyValue, node: str) -> None:
        self.kv = kv
        self.node = encode_token(node)

    async def applied(self, event_id: str) -> bool:
        return await self._has(f"{self.node}.work.{encode_token(event_id)}")

    async def finished(self, uid: str) -> bool:
        return await self._has(f"{self.node}.vmi.{encode_token(uid)}")

    async def record_applied(self, command: NodeCommand) -> None:
        await self.mark_applied(command.event_id, AppliedWork(
            uid=command.uid, verb=command.verb, command_id=command.command_id))

    async def mark_applied(self, event_id: str, done: AppliedWork) -> None:
        await self.kv.put(f"{self.node}.work.{encode_token(event_id)}",
                          msgspec.msgpack.encode(done))

    async def migrations(self) -> MigrationBook:
        try:
            entry = await self.kv.get(f"{self.node}.migrations")
        except KeyNotFoundError:
            return MigrationBook()
        return msgspec.msgpack.decode(entry.value or b"", type=MigrationBook)

    async def record_migrations(self, book: MigrationBook) -> None:
        await self.kv.put(f"{self.node}.migrations", msgspec.msgpack.encode(book))

    async def record_finished(self, uid: str, reason: str) -> None:
        await self.kv.put(f"{self.node}.vmi.{encode_token(uid)}",
                          msgspec.msgpack.encode(FinishedVMI(reason=reason)))

    async def _has(self, key: str) -> bool:
        try:
            await self.kv.get(key)
        except KeyNotFoundError:  # a deleted key too
            return False
        return True


async def open_worklog(js: JetStreamContext, layout: Layout, node: str) -> WorkLog:
    """`node`'s work log, once the control plane has made the bucket (with the installation,
    just after the streams an agent waits for)."""
    while True:
        try:
            return WorkLog(await js.key_value(layout.applied_bucket), node)
        except BucketNotFoundError:
            await asyncio.sleep(WORKLOG_POLL_SECONDS)  # polling for another process's set-up
