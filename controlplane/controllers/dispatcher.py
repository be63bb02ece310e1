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
from events.messages import NodeCommand
from events.subjects import Layout
from events.vm import (
    NODE_UNRESPONSIVE,
    VirtualMachineInstanceDeletionRequested,
    VirtualMachineInstanceNodeAction,
    VirtualMachineInstancePhaseChanged,
    VirtualMachineInstanceScheduled,
)
from projections.cluster import ClusterState
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
        command = self.node_command(event, state)
        if command is not None:
            node, verb, body = command
            subject = self.layout.node_subject(node, verb)
            await self.js.publish(subject, _encode(body), headers={"Nats-Msg-Id": str(event.id)})
            log.info("dispatched", node=node, verb=verb, vmi=body.name,
                     namespace=body.namespace, event_sequence=sequence,
                     correlation_id=event.correlation_id, command_id=event.causation_id)
            await self._save(sequence)
        self.position = sequence

    async def flush(self) -> None:
        """Persist the position after a run of events that needed no dispatch."""
        await self._save(self.position)

    async def _save(self, sequence: int) -> None:
        assert self._checkpoints is not None, "load_checkpoint() first"
        await self._checkpoints.put(CHECKPOINT_KEY, str(sequence).encode())

    @staticmethod
    def node_command(event: Event, state: ClusterState) -> tuple[str, str, NodeCommand] | None:
        view = state.views.get(event.originator_id)
        if not isinstance(view, VirtualMachineInstanceView) or view.spec is None:
            return None
        meta = view.metadata
        common: dict[str, Any] = {"event_id": str(event.id), "namespace": meta.namespace,
                                  "name": meta.name, "uid": view.uid,
                                  "command_id": event.causation_id,
                                  "correlation_id": event.correlation_id}
        match event:
            case VirtualMachineInstanceScheduled(node=node):
                vmi = {"apiVersion": API_VERSION, "kind": "VirtualMachineInstance",
                       "metadata": {"name": meta.name, "namespace": meta.namespace,
                                    "uid": view.uid},
                       "spec": msgspec.to_builtins(view.spec)}
                return node, "launch", NodeCommand(verb="launch", vmi=vmi, **common)
            case VirtualMachineInstanceDeletionRequested(grace_period_seconds=grace):
                if not view.node:
                    return None
                return view.node, "stop", NodeCommand(verb="stop", grace_period_seconds=grace,
                                                      **common)
            case VirtualMachineInstanceNodeAction(action=action):
                if not view.node:
                    return None
                return view.node, action, NodeCommand(verb=action, **common)
            case VirtualMachineInstancePhaseChanged(reason=reason) if (
                    reason == NODE_UNRESPONSIVE and view.node):
                # Failed while its node was silent, and maybe replaced elsewhere: the guest
                # may still run there, and virt-handler removes the domain of a final VMI.
                return view.node, "stop", NodeCommand(verb="stop", **common)
            case _:
                return None
