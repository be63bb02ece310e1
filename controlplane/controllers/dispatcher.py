"""The dispatcher: the outbox that turns events into node work. Never a dual write.

Events are appended first; the dispatcher follows the log from its checkpoint and publishes
each node command with `Nats-Msg-Id` set to the event's id, then moves the checkpoint. A
crash in between publishes again on restart, and JetStream's duplicate window drops the
copy; past the window, the agent's own idempotence (domains by name) still holds.

| event                                   | node command                     |
|-----------------------------------------|----------------------------------|
| VirtualMachineInstanceScheduled         | launch on that node              |
| VirtualMachineInstanceDeletionRequested | stop (with grace) where it runs  |
| VirtualMachineInstanceNodeAction        | pause / unpause / restart        |
| VirtualMachineInstancePhaseChanged to   | stop (at once) where it ran: the |
| Failed, NodeUnresponsive                | node destroys it when it is back |
| MigrationTargetScheduled                | migrate-prepare on the target    |
| MigrationPhaseChanged TargetReady       | migrate on the source            |
| MigrationAbortRequested (transferring)  | migrate-abort on the source      |
| MigrationPhaseChanged Succeeded         | migrate-finish on the target,    |
|                                         | migrate-cleanup on the source    |
| MigrationPhaseChanged Failed            | migrate-abort on the source (if  |
|                                         | it was told to migrate), migrate-|
|                                         | cleanup on the target            |

An event that makes work for two nodes publishes one message per node, each with the
event's id and the verb as its `Nats-Msg-Id`.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from events.api.vm import API_VERSION
from events.codec import Event
from events.messages import NodeCommand, NodeVerb
from events.migration import (
    MigrationAbortRequested,
    MigrationPhaseChanged,
    MigrationTargetScheduled,
)
from events.subjects import Layout
from events.vm import (
    NODE_UNRESPONSIVE,
    VirtualMachineInstanceDeletionRequested,
    VirtualMachineInstanceNodeAction,
    VirtualMachineInstancePhaseChanged,
    VirtualMachineInstanceScheduled,
)
from projections.cluster import ClusterState
from projections.migration import MigrationView
from projections.views import VirtualMachineInstanceView

log = structlog.get_logger(__name__)

CHECKPOINT_KEY = "dispatcher"
_encode = msgspec.msgpack.Encoder().encode


class Dispatcher:
    def __init__(self, nc: Client, layout: Layout) -> None:
        self.nc = nc
        self.layout = layout
        self.js = nc.jetstream()
        self.position = 0
        self._checkpoints: KeyValue | None = None

    async def load_checkpoint(self) -> int:
        """Where dispatch stopped last time; also binds the bucket once for every save."""
        self._checkpoints = await self.js.key_value(self.layout.checkpoints_bucket)
        try:
            entry = await self._checkpoints.get(CHECKPOINT_KEY)
        except KeyNotFoundError:
            self.position = 0
        else:
            self.position = int(entry.value or b"0")
        return self.position

    async def on_event(self, sequence: int, event: Event, state: ClusterState) -> None:
        if sequence <= self.position:
            return
        work = self.node_commands(event, state)
        for node, verb, body in work:
            subject = self.layout.node_subject(node, verb)
            msg_id = str(event.id) if len(work) == 1 else f"{event.id}:{verb}"
            await self.js.publish(subject, _encode(body), headers={"Nats-Msg-Id": msg_id})
            log.info("dispatched", node=node, verb=verb, vmi=body.name,
                     namespace=body.namespace, event_sequence=sequence,
                     correlation_id=event.correlation_id, command_id=event.causation_id)
        if work:
            await self._save(sequence)
        self.position = sequence

    async def flush(self) -> None:
        """Persist the position after a run of events that needed no dispatch."""
        await self._save(self.position)

    async def _save(self, sequence: int) -> None:
        assert self._checkpoints is not None, "load_checkpoint() first"
        await self._checkpoints.put(CHECKPOINT_KEY, str(sequence).encode())

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
    return {"event_id": str(event.id), "namespace": meta.namespace, "name": meta.name,
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
    common = {**_common(event, vmi), "migration": order}
    transferring = any(phase == "TargetReady" for phase, _ in migration.transitions)

    def work(node: str, verb: NodeVerb, with_vmi: bool = False) -> tuple[str, str, NodeCommand]:
        manifest = vmi_manifest(vmi) if with_vmi else None
        return node, verb, NodeCommand(verb=verb, vmi=manifest, **common)

    match event:
        case MigrationTargetScheduled():
            return [work(order.target_node, "migrate-prepare", with_vmi=True)]
        case MigrationPhaseChanged(phase="TargetReady"):
            return [work(order.source_node, "migrate", with_vmi=True)]
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
