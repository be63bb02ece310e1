"""The node's work, taken from its work queue one item at a time and applied once.

An item fetched is an item claimed (its claim renewed while it is worked on), so none waits
out its ack wait in a batch behind slow work and comes twice. Each is applied in the order
do, report, record, acknowledge (`nodeagent.worklog`; `nodeagent.agent` gives the crash
windows); an item whose event id is recorded already is only acknowledged.

An item that does not decode or does not make sense (another verb than its subject's, no
event id or uid, a VMI to launch that is not the command's), or that trips an unexpected
error, is logged with its subject, counted and terminated: JetStream never delivers it again.
An item NATS kept the agent from finishing (no record, no ack) comes again, at most
`WORK_MAX_DELIVER` times; so does a stop libvirt failed, after `STOP_RETRY_SECONDS`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

import libvirt
import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from events.api.errors import VirtbusError
from events.jetstream.streams import WORK_MAX_DELIVER, work_consumer
from events.jetstream.transient import describe, is_transient, note, retry_until_stopped
from events.language.messages import MAX_ID_LENGTH, MAX_NAME_LENGTH, MAX_TOKEN_LENGTH, NodeCommand
from events.language.subjects import Layout
from events.runtime.aio import claimed, pause_unless_stopped, unless_stopped
from nodeagent.defaults import FETCH_WAIT_SECONDS, STOP_RETRY_SECONDS
from nodeagent.reporter import serving
from nodeagent.vmiref import VMIRef

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext

    from nodeagent.guests import Guests
    from nodeagent.migrating import Migrations
    from nodeagent.worklog import WorkLog

LAUNCHING_VERBS: Final = frozenset({"launch", "migrate-finish"})
"""The verbs that start a guest: a failure to is reported as the VMI's."""
INSTANCE_VERBS: Final = frozenset({"pause", "unpause", "restart"})
"""Verbs on a running guest: done only to the instance (uid) the work names, as a stop."""


class WorkConsumer:
    """One node's work (see the module)."""

    def __init__(self, nc: Client, layout: Layout, guests: Guests, migrations: Migrations,
                 worklog: WorkLog, *, busy: asyncio.Lock, active: asyncio.Event) -> None:
        self.nc, self.layout, self.guests, self.migrations = nc, layout, guests, migrations
        self.worklog = worklog
        self.node = guests.node
        self.busy = busy
        self.active = active
        """Cleared while the agent is silenced: no work is taken."""
        self.log = guests.log
        self.rejected = 0
        """Work items terminated as bad since start (each logged with its subject)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Take the node's work until `stop`. A pull NATS cannot serve (no consumer leader, a
        server lost, the consumer gone) is one log line, a pause, and a wait for the
        consumer, one line per look: the control plane creates it and sets it up again, the
        agent only binds to it (`events.jetstream.streams.work_consumer`)."""
        js = self.nc.jetstream()
        if not await self._consumer_there(js, stop):
            return
        sub = await js.pull_subscribe_bind(durable=work_consumer(self.node),
                                           stream=self.layout.node_stream)
        failures = 0
        while not stop.is_set():
            if not self.active.is_set():
                await unless_stopped(self.active.wait(), stop)  # a silenced agent does nothing
                continue
            try:
                msgs = await sub.fetch(1, timeout=FETCH_WAIT_SECONDS)
            except TimeoutError:  # no work now
                continue
            except Exception as e:
                if not is_transient(e):
                    raise
                failures += 1
                await pause_unless_stopped(stop, note("taking node work", e, failures,
                                                      node=self.node))
                if not await self._consumer_there(js, stop):
                    return
                continue
            failures = 0
            for msg in msgs:
                try:
                    await self._handle(msg)
                except (TimeoutError, NatsError) as e:  # NATS's trouble, not the work's
                    self.log.warning("node work unfinished; it is delivered again",
                                     subject=msg.subject, error=describe(e))

    async def _consumer_there(self, js: JetStreamContext, stop: asyncio.Event) -> bool:
        """Once the node's work consumer exists; False if `stop` came first."""
        return await retry_until_stopped(
            lambda: js.consumer_info(self.layout.node_stream, work_consumer(self.node)),
            "waiting for the node's work consumer (the control plane makes it)", stop,
            node=self.node) is not None

    async def _handle(self, msg: Msg) -> None:
        """One work item, isolated: a bad one is rejected, any other applied (see above)."""
        try:
            command = msgspec.msgpack.decode(msg.data, type=NodeCommand)
        except msgspec.DecodeError as e:
            await self._reject(msg, f"not a node command: {e}")
            return
        if refusal := self._refusal(command, msg.subject):
            await self.migrations.refused(command, refusal)
            await self._reject(msg, refusal, event_id=command.event_id)
            return
        ref = VMIRef(command.namespace, command.name, command.uid)
        with serving(command.correlation_id), structlog.contextvars.bound_contextvars(
                vmi=ref.name, namespace=ref.namespace, verb=command.verb,
                event_id=command.event_id, command_id=command.command_id,
                correlation_id=command.correlation_id):
            try:
                await self._apply(msg, command, ref)
            except (TimeoutError, NatsError):
                raise
            except Exception as e:  # a bug this item trips must not stop the agent
                await self._reject(msg, f"{type(e).__name__}: {e}", event_id=command.event_id,
                                   error=e)

    def _refusal(self, command: NodeCommand, subject: str) -> str:
        """Why a decoded work item makes no sense as it stands; '' when it does."""
        if subject != self.layout.node_subject(self.node, command.verb):
            return f"a {command.verb!r} command on another verb's subject"
        if not command.event_id or not command.uid:
            return "no event id or no VMI uid: it could be neither recorded nor checked"
        for field, value, limit in (
                ("eventId", command.event_id, MAX_ID_LENGTH), ("uid", command.uid, MAX_ID_LENGTH),
                ("namespace", command.namespace, MAX_TOKEN_LENGTH),
                ("name", command.name, MAX_NAME_LENGTH)):
            if len(value) > limit:  # each becomes a subject, whose line the server limits
                return f"{field}: must be at most {limit} characters"
        if command.vmi is not None:
            meta = command.vmi.get("metadata")
            names = [meta.get(k) for k in ("namespace", "name", "uid")] \
                if isinstance(meta, dict) else []
            if names != [command.namespace, command.name, command.uid]:
                return "its VMI is not the one the command names"
        return self.migrations.refusal(command)

    async def _reject(self, msg: Msg, reason: str, *, event_id: str = "",
                      error: Exception | None = None) -> None:
        """Log (one line, with the subject), count and terminate a work item: JetStream
        never delivers it again and says so in a MSG_TERMINATED advisory."""
        self.rejected += 1
        self.log.error("node work rejected", subject=msg.subject, event_id=event_id,
                       reason=reason, rejected=self.rejected, exc_info=error)
        await msg.term()

    async def _apply(self, msg: Msg, command: NodeCommand, ref: VMIRef) -> None:
        """Do, report, record, acknowledge, in that order; an item whose event id is
        recorded already is only acknowledged."""
        if await self.worklog.applied(command.event_id):
            self.log.info("node work already applied")
            await msg.ack()
            return
        self.log.info("node command")
        self.guests.in_progress[ref.domain] = command.correlation_id
        try:
            async with claimed(msg), self.busy:
                await self.execute(command, ref)
        except (VirtbusError, libvirt.libvirtError) as e:
            self.log.warning("node command failed", error=str(e))
            if command.verb in LAUNCHING_VERBS:
                await self.guests.report_launch_failed(ref, e)
            elif command.verb == "stop" and isinstance(e, libvirt.libvirtError) \
                    and msg.metadata.num_delivered < WORK_MAX_DELIVER:
                await msg.nak(delay=STOP_RETRY_SECONDS)  # not recorded: done again later
                return
        finally:
            self.guests.in_progress.pop(ref.domain, None)
        await self.worklog.record_applied(command)
        await msg.ack()

    async def execute(self, command: NodeCommand, ref: VMIRef) -> None:
        """What the item's verb does to the host."""
        if command.verb in INSTANCE_VERBS and await self.guests.another_instances(ref, "done"):
            return
        match command.verb:
            case "launch":
                await self.guests.launch(command.vmi, ref)
            case "stop":
                await self.guests.stop(ref, command.grace_period_seconds)
            case "pause":
                await self.guests.pause(ref)
            case "unpause":
                await self.guests.unpause(ref)
            case "restart":
                await self.guests.restart(ref)
            case _:
                await self.migrations.execute(command, ref)
