"""What the store tests share: a node's registration manifest, and executing a command the way
the control loop does (folding its events into a `ClusterState`)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from controlplane.writeprotocol import CommandHandler, Result
from events.jetstream.bridge import NatsBridge
from events.jetstream.datastore import EventLog, JetStreamDatastore
from events.jetstream.store import JetStreamApplicationRecorder
from events.jetstream.streams import ensure_all
from events.language.codec import Event
from events.language.messages import Command
from events.language.subjects import Layout
from projections.cluster import ClusterState
from projections.follower import follow


class SyncHandler:
    """The control plane's command handler, driven from synchronous tests: its own
    connection on a bridge thread, and a library recorder to read the log with."""

    def __init__(self, nats_url: str, layout: Layout) -> None:
        self.bridge = NatsBridge(nats_url, name="test-handler")
        self.bridge.run(ensure_all(self.bridge.nc.jetstream(), layout))
        self.handler = CommandHandler(EventLog(self.bridge.nc, layout))
        self.datastore = JetStreamDatastore(nats_url, layout)
        self.recorder = JetStreamApplicationRecorder(self.datastore)

    def execute(self, command: Command) -> Result:
        return self.bridge.run(self.handler.execute(command))

    def close(self) -> None:
        self.datastore.close()
        self.bridge.close()


def replayed(handler: SyncHandler, layout: Layout) -> ClusterState:
    """The read model rebuilt from the log alone, as a restarted control plane has it."""
    state = ClusterState()

    async def replay() -> None:
        stop = asyncio.Event()

        async def on_event(sequence: int, event: Event) -> None:
            state.apply(event, sequence)

        async def caught_up() -> None:
            stop.set()

        await follow(handler.bridge.nc, layout, on_event, on_caught_up=caught_up, stop=stop)

    handler.bridge.run(replay())
    return state


def node_info(name: str, *, devices: bool = True) -> dict[str, Any]:
    """The manifest node `name` registers with; with `devices`, its allocatable counts the
    KVM and TUN devices too."""
    allocatable = {"cpu": "8", "memory": "16Gi"}
    if devices:
        allocatable |= {"devices.kubevirt.io/kvm": "110", "devices.kubevirt.io/tun": "110"}
    return {"nodeName": name, "hostname": name, "architecture": "x86_64",
            "hypervisorUri": "test:///default", "domainType": "qemu", "libvirtVersion": "10.0.0",
            "capacity": {"cpu": "8", "memory": "16Gi"}, "allocatable": allocatable}


def run(handler: SyncHandler, state: ClusterState, command: Command) -> Result:
    """Execute and fold the events into `state`, as the control loop does; the result, whatever
    the outcome (see `run_accepted`)."""
    result = handler.execute(command)
    for sequence, event in result.events:
        state.apply(event, sequence)
    return result


def run_accepted(handler: SyncHandler, state: ClusterState, command: Command) -> Result:
    """`run`, asserting the command is accepted."""
    result = run(handler, state, command)
    assert result.outcome.accepted, result.outcome.reason
    return result


def register_command(name: str, *, devices: bool = True) -> Command:
    """Node `name` registering itself (see `node_info`)."""
    return Command(id=str(uuid.uuid4()), actor="system:node:" + name, kind="Node",
                   verb="register", name=name, manifest=node_info(name, devices=devices))


def register(handler: SyncHandler, name: str) -> list[int]:
    """Register node `name` (without devices); the sequences of its events."""
    result = handler.execute(register_command(name, devices=False))
    assert result.outcome.accepted, result.outcome.reason
    return [sequence for sequence, _ in result.events]
