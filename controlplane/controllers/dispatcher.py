"""The dispatcher: the outbox that turns events into node work. Never a dual write.

Events are appended first; the dispatcher follows the log from its checkpoint and publishes
each node command with `Nats-Msg-Id` set to the event's id, then moves the checkpoint. A
crash in between publishes again on restart, and JetStream's duplicate window drops the
copy; past the window, the agent's own idempotence (domains by name) still holds.

Following the log only queues the work (so the read model and the controllers never wait
for a publish); `run` publishes what is queued a batch at a time: each VMI's commands on a
node one after the other in the log's order, each acknowledged before the next (a publish
NATS fails for a moment is tried again in place), the VMIs side by side (at most
`DISPATCH_IN_FLIGHT` publishes at once); then one checkpoint write for the whole batch,
never past work not yet acknowledged. A full queue is drained by the follower itself, so
the queue is bounded whether `run` runs or not. The order that matters is one VMI's (a
launch before its stop; an instance's stop before the next instance of that name's
launch): the agent works on each VMI alone. A node's commands one after the other made a
node with a hundred launches in a batch wait a hundred round trips, on a busy loop: the
largest lag of a 10,000-VM run, 10 s from a VMI scheduled to its launch published.

| event                                   | node command                     |
|-----------------------------------------|----------------------------------|
| VirtualMachineInstanceScheduled         | launch on that node              |
| VirtualMachineInstanceDeletionRequested | stop (with grace) where it runs  |
| VirtualMachineInstanceNodeAction        | pause / unpause / restart        |
| VirtualMachineInstancePhaseChanged to   | stop (at once) where it ran: the |
| Failed, NodeUnresponsive                | node destroys it when it is back |
| MigrationTargetScheduled                | migrate-prepare on the target    |
| MigrationPhaseChanged TargetReady       | migrate on the source (the order |
|                                         | with the target's address)       |
| MigrationAbortRequested (transferring)  | migrate-abort on the source      |
| MigrationPhaseChanged Succeeded         | migrate-finish on the target,    |
|                                         | migrate-cleanup on the source    |
| MigrationPhaseChanged Failed            | migrate-abort on the source (if  |
|                                         | it was told to migrate), migrate-|
|                                         | cleanup on the target            |

An event that makes work for two nodes publishes one message per node, each with the
event's id and the verb as its `Nats-Msg-Id`.

Each node's work consumer is the control plane's to make (`WorkConsumers`): on the node's
registration, before the node's first dispatch, and again whenever the control loop's check
finds it gone. The agent only binds to it and pulls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client
from nats.js.errors import APIError
from nats.js.kv import KeyValue

from controlplane.defaults import (
    DISPATCH_IN_FLIGHT,
    DISPATCH_QUEUE,
    WORK_CONSUMERS_CHECK_SECONDS,
)
from events.api.vm import API_VERSION
from events.jetstream.streams import get_key, work_consumer, work_consumer_config
from events.jetstream.transient import is_transient, retry_until_stopped
from events.language.codec import Event
from events.language.kinds.migration import (
    MigrationAbortRequested,
    MigrationPhaseChanged,
    MigrationTargetScheduled,
)
from events.language.kinds.nodes import NodeRegistered
from events.language.kinds.vm import (
    NODE_UNRESPONSIVE,
    VirtualMachineInstanceDeletionRequested,
    VirtualMachineInstanceNodeAction,
    VirtualMachineInstancePhaseChanged,
    VirtualMachineInstanceScheduled,
)
from events.language.messages import MigrationOrder, NodeCommand, NodeVerb
from events.language.subjects import Layout, split_aggregate_id
from events.runtime.aio import unless_stopped
from projections.cluster import ClusterState
from projections.kinds.migration import MigrationView
from projections.kinds.vm import VirtualMachineInstanceView

log = structlog.get_logger(__name__)

CHECKPOINT_KEY = "dispatcher"
_encode = msgspec.msgpack.Encoder().encode
_encode_json = msgspec.json.Encoder().encode


class _Names(msgspec.Struct):
    """A page of JetStream's consumer names list (nats-py has no call for it)."""

    consumers: list[str] | None = None
    total: int = 0
    error: dict[str, Any] | None = None


_decode_names = msgspec.json.Decoder(_Names).decode


class WorkConsumers:
    """Each node's work consumer (`events.jetstream.streams.work_consumer_config`), made
    by the control plane. No node agent may create or update a consumer: the create
    request's body, which no permission sees, could make its consumer a push consumer,
    publishing the node's work in the store's account on a subject of the agent's choosing."""

    def __init__(self, nc: Client, layout: Layout) -> None:
        self.nc = nc
        self.layout = layout
        self.made: set[str] = set()
        """Nodes whose consumer this process set up, and has not found gone since."""
        self._making: dict[str, asyncio.Lock] = {}

    async def ensure(self, node: str) -> None:
        """Set up `node`'s consumer, once, unless `check` finds it gone. One that cannot be
        brought to the config (a push consumer made before agents lost the right) is
        deleted and made afresh: its work stays in the stream, for the new one. One at a
        time per node: the node's VMIs are dispatched side by side."""
        if node in self.made:
            return
        async with self._making.setdefault(node, asyncio.Lock()):
            if node not in self.made:
                await self._make(node)

    async def _make(self, node: str) -> None:
        js, stream = self.nc.jetstream(), self.layout.node_stream
        config = work_consumer_config(self.layout, node)
        try:
            await js.add_consumer(stream, config)
        except APIError as e:
            if is_transient(e):
                raise
            log.warning("a node's work consumer is not as the control plane makes it; making "
                        "it afresh", node=node, error=str(e))
            await js.delete_consumer(stream, work_consumer(node))
            await js.add_consumer(stream, config)
        self.made.add(node)
        log.info("node work consumer set up", node=node, consumer=work_consumer(node))

    async def check(self, nodes: Iterable[str]) -> None:
        """Set up again every consumer of `nodes` the node stream no longer has (deleted,
        lost with its stream or its server); one request lists them all."""
        present = await self._names()
        for node in sorted(self.made):
            if work_consumer(node) not in present:
                log.warning("a node's work consumer is gone; setting it up again", node=node)
                self.made.discard(node)
        for node in nodes:
            await self.ensure(node)

    async def _names(self) -> set[str]:
        """The node stream's consumers, a page at a time."""
        subject = f"$JS.API.CONSUMER.NAMES.{self.layout.node_stream}"
        names: set[str] = set()
        while True:
            reply = await self.nc.request(subject, _encode_json({"offset": len(names)}),
                                          timeout=WORK_CONSUMERS_CHECK_SECONDS)
            page = _decode_names(reply.data)
            if page.error is not None:
                APIError.from_error(page.error)  # raises it, as nats-py's own calls do
            names.update(page.consumers or [])
            if not page.consumers or len(names) >= page.total:
                return names


@dataclass(frozen=True, slots=True)
class _Work:
    """One node command to publish, and the event it is for."""

    sequence: int
    event: Event
    node: str
    verb: str
    body: NodeCommand
    msg_id: str


class Dispatcher:
    def __init__(self, nc: Client, layout: Layout) -> None:
        self.nc = nc
        self.layout = layout
        self.js = nc.jetstream()
        self.consumers = WorkConsumers(nc, layout)
        self.position = 0
        """The last event followed: its work, and all before it, is published or queued."""
        self._checkpoints: KeyValue | None = None
        self._queue: list[_Work] = []
        """Work to publish, in the log's order."""
        self._queued = asyncio.Event()
        self._draining = asyncio.Lock()
        """One batch at a time, so a VMI's commands go out in the log's order."""
        self._in_flight = asyncio.Semaphore(DISPATCH_IN_FLIGHT)
        self._stop = asyncio.Event()

    async def load_checkpoint(self) -> int:
        """Where dispatch stopped last time; also binds the bucket once for every save."""
        self._checkpoints = await self.js.key_value(self.layout.checkpoints_bucket)
        entry = await get_key(self._checkpoints, CHECKPOINT_KEY)
        self.position = int(entry.value or b"0") if entry is not None else 0
        return self.position

    async def run(self, stop: asyncio.Event) -> None:
        """Publish the queued work as it comes, a batch at a time, until `stop`; what NATS
        refuses for good is raised here."""
        self._stop = stop
        while await unless_stopped(self._queued.wait(), stop):
            await self._drain()

    async def on_event(self, sequence: int, event: Event, state: ClusterState) -> None:
        """Queue the event's node work (decided on `state` as it is now); publish the queue
        here when it is full."""
        if sequence <= self.position:
            return
        if isinstance(event, NodeRegistered):
            await self.consumers.ensure(split_aggregate_id(event.originator_id)[2])
        work = self.node_commands(event, state)
        if work and len(self._queue) >= DISPATCH_QUEUE:
            await self._drain()
        for node, verb, body in work:
            msg_id = event.id if len(work) == 1 else f"{event.id}:{verb}"
            self._queue.append(_Work(sequence, event, node, verb, body, msg_id))
            self._queued.set()
        self.position = sequence

    async def flush(self) -> None:
        """Publish everything queued, then persist the position (past a run of events that
        needed no dispatch too)."""
        if await self._drain():
            await self._save(self.position)

    async def _drain(self) -> bool:
        """Publish what is queued, then save the checkpoint: the position when the batch was
        taken, whose work is all in it or published before. False if stopped first: the
        checkpoint is left where it was and the batch queued again (its copies already
        published are dropped by their ids)."""
        async with self._draining:
            self._queued.clear()
            batch, self._queue, position = self._queue, [], self.position
            if not batch:
                return True
            by_vmi: dict[tuple[str, str, str], list[_Work]] = {}
            for work in batch:
                key = (work.node, work.body.namespace, work.body.name)
                by_vmi.setdefault(key, []).append(work)
            sent = await asyncio.gather(*[self._publish(node, works)
                                          for (node, _, _), works in by_vmi.items()])
            if not all(sent):
                self._queue[:0] = batch  # for whoever drains next: nothing is skipped
                return False
            await self._save(position)
            return True

    async def _publish(self, node: str, works: list[_Work]) -> bool:
        """One VMI's commands for `node`, one after the other; False if stopped before all
        were acknowledged."""
        subject_of = self.layout.node_subject
        for work in works:
            async def publish(work: _Work = work) -> bool:
                await self.consumers.ensure(node)
                async with self._in_flight:
                    await self.js.publish(subject_of(node, work.verb), _encode(work.body),
                                          headers={"Nats-Msg-Id": work.msg_id})
                return True

            if not await retry_until_stopped(publish, "dispatching", self._stop, node=node,
                                             event_sequence=work.sequence):
                return False
            body, event = work.body, work.event
            log.info("dispatched", node=node, verb=work.verb, vmi=body.name,
                     namespace=body.namespace, event_sequence=work.sequence,
                     correlation_id=event.correlation_id, command_id=event.causation_id)
        return True

    async def _save(self, sequence: int) -> None:
        """The checkpoint, tried again while NATS cannot take it (the bucket's leader being
        elected), so a batch published is never a reason to stop; not saved if stopped
        first (its work is published again at the next start, and dropped by its ids)."""
        checkpoints = self._checkpoints
        assert checkpoints is not None, "load_checkpoint() first"
        await retry_until_stopped(
            lambda: checkpoints.put(CHECKPOINT_KEY, str(sequence).encode()),
            "saving the dispatcher's checkpoint", self._stop, event_sequence=sequence)

    @staticmethod
    def node_commands(event: Event, state: ClusterState) -> list[tuple[str, str, NodeCommand]]:
        view = state.views.get(event.originator_id)
        if isinstance(view, MigrationView):
            return _migration_work(event, view, state)
        if not isinstance(view, VirtualMachineInstanceView) or view.spec is None:
            return []
        match event:
            case VirtualMachineInstanceScheduled(node=node):
                return [(node, "launch", NodeCommand(verb="launch", vmi=vmi_manifest(view),
                                                     **_common(event, view)))]
            case VirtualMachineInstanceDeletionRequested(grace_period_seconds=grace):
                if not view.node:
                    return []
                return [(view.node, "stop", NodeCommand(verb="stop", grace_period_seconds=grace,
                                                        **_common(event, view)))]
            case VirtualMachineInstanceNodeAction(action=action):
                if not view.node:
                    return []
                return [(view.node, action, NodeCommand(verb=action, **_common(event, view)))]
            case VirtualMachineInstancePhaseChanged(reason=reason) if (
                    reason == NODE_UNRESPONSIVE and view.node):
                # Failed while its node was silent, and maybe replaced elsewhere: the guest
                # may still run there, and virt-handler removes the domain of a final VMI.
                return [(view.node, "stop", NodeCommand(verb="stop", **_common(event, view)))]
            case _:
                return []


def _common(event: Event, vmi: VirtualMachineInstanceView) -> dict[str, Any]:
    meta = vmi.metadata
    return {"event_id": event.id, "namespace": meta.namespace, "name": meta.name,
            "uid": vmi.uid, "command_id": event.causation_id,
            "correlation_id": event.correlation_id}


def vmi_manifest(vmi: VirtualMachineInstanceView) -> dict[str, Any]:
    """The VMI as an agent needs it to run the guest, in KubeVirt's JSON shape."""
    meta = vmi.metadata
    metadata: dict[str, Any] = {"name": meta.name, "namespace": meta.namespace, "uid": vmi.uid}
    if meta.annotations:
        metadata["annotations"] = dict(meta.annotations)
    return {"apiVersion": API_VERSION, "kind": "VirtualMachineInstance", "metadata": metadata,
            "spec": msgspec.to_builtins(vmi.spec)}


def _migration_work(event: Event, migration: MigrationView,
                    state: ClusterState) -> list[tuple[str, str, NodeCommand]]:
    """The node work a migration's step makes (see the table above)."""
    order = migration.order
    vmi = state.vmi(migration.metadata.namespace, migration.vmi_name)
    if order is None or vmi is None or vmi.spec is None or vmi.uid != migration.vmi_uid:
        return []
    common = _common(event, vmi)
    transferring = any(phase == "TargetReady" for phase, _ in migration.transitions)

    def work(node: str, verb: NodeVerb, with_vmi: bool = False,
             given: MigrationOrder = order) -> tuple[str, str, NodeCommand]:
        manifest = vmi_manifest(vmi) if with_vmi else None
        return node, verb, NodeCommand(verb=verb, vmi=manifest, migration=given, **common)

    match event:
        case MigrationTargetScheduled():
            return [work(order.target_node, "migrate-prepare", with_vmi=True)]
        case MigrationPhaseChanged(phase="TargetReady", target_address=address):
            return [work(order.source_node, "migrate", with_vmi=True,
                         given=msgspec.structs.replace(order, target_address=address))]
        case MigrationAbortRequested() if transferring and not migration.finished:
            return [work(order.source_node, "migrate-abort")]
        case MigrationPhaseChanged(phase="Succeeded"):
            return [work(order.target_node, "migrate-finish", with_vmi=True),
                    work(order.source_node, "migrate-cleanup")]
        case MigrationPhaseChanged(phase="Failed"):
            abort = [work(order.source_node, "migrate-abort")] if transferring else []
            return [*abort, work(order.target_node, "migrate-cleanup")]
        case _:
            return []
