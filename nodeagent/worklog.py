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

What NATS fails for a moment (a server lost, a leader being elected) is tried again in place,
one log line per attempt, until the agent stops; then the last failure is raised
(`events.jetstream.transient.retry_while_running`): the agent rides a failover out rather
than exit, and work whose record NATS would not take is left unacknowledged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from events.jetstream.transient import retry_while_running
from events.language.messages import MigrationOrder, NodeCommand
from events.language.subjects import Layout, encode_token
from nodeagent.defaults import WORKLOG_POLL_SECONDS

T = TypeVar("T")


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
    """One node's keys in the applied-work bucket, each call retried until `stop` (above)."""

    def __init__(self, kv: KeyValue, node: str, stop: asyncio.Event) -> None:
        self.kv = kv
        self.node = encode_token(node)
        self._node_name = node
        self._stop = stop

    async def applied(self, event_id: str) -> bool:
        return await self._retried(lambda: self._has(f"{self.node}.work.{encode_token(event_id)}"),
                                   "looking up applied work")

    async def finished(self, uid: str) -> bool:
        return await self._retried(lambda: self._has(f"{self.node}.vmi.{encode_token(uid)}"),
                                   "looking up a finished VMI")

    async def record_applied(self, command: NodeCommand) -> None:
        await self.mark_applied(command.event_id, AppliedWork(
            uid=command.uid, verb=command.verb, command_id=command.command_id))

    async def mark_applied(self, event_id: str, done: AppliedWork) -> None:
        await self._retried(lambda: self.kv.put(f"{self.node}.work.{encode_token(event_id)}",
                                                msgspec.msgpack.encode(done)),
                            "recording applied work")

    async def migrations(self) -> MigrationBook:
        entry = await self._retried(self._migrations_entry, "reading the migrations")
        if entry is None:
            return MigrationBook()
        return msgspec.msgpack.decode(entry, type=MigrationBook)

    async def record_migrations(self, book: MigrationBook) -> None:
        """`book` as it is at each attempt: a write retried after a change writes the change
        too."""
        await self._retried(lambda: self.kv.put(f"{self.node}.migrations",
                                                msgspec.msgpack.encode(book)),
                            "recording the migrations")

    async def record_finished(self, uid: str, reason: str) -> None:
        await self._retried(lambda: self.kv.put(f"{self.node}.vmi.{encode_token(uid)}",
                                                msgspec.msgpack.encode(FinishedVMI(reason=reason))),
                            "recording a finished VMI")

    async def _migrations_entry(self) -> bytes | None:
        try:
            entry = await self.kv.get(f"{self.node}.migrations")
        except KeyNotFoundError:
            return None
        return entry.value or b""

    async def _has(self, key: str) -> bool:
        try:
            await self.kv.get(key)
        except KeyNotFoundError:  # a deleted key too
            return False
        return True

    async def _retried(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        return await retry_while_running(call, what, self._stop, node=self._node_name)


async def open_worklog(js: JetStreamContext, layout: Layout, node: str,
                       stop: asyncio.Event) -> WorkLog:
    """`node`'s work log, once the control plane has made the bucket (with the installation,
    just after the streams an agent waits for)."""

    async def bucket() -> KeyValue:
        while True:
            try:
                return await js.key_value(layout.applied_bucket)
            except BucketNotFoundError:
                await asyncio.sleep(WORKLOG_POLL_SECONDS)  # polling for another process's set-up

    kv = await retry_while_running(bucket, "opening the work log", stop, node=node)
    return WorkLog(kv, node, stop)
