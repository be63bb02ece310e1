"""The control loop does not hold every later decision behind one slow controller command,
and takes no decision about an object whose own command is still in flight (KubeVirt's
controller expectations): an event on it waits until that command is recorded."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable

from nats.aio.client import Client

from controlplane.loop import ControlLoop
from controlplane.writeprotocol import Announce, Result, nobody
from controlplane.writer import Writer
from events.jetstream.connect import connect
from events.language.codec import Event
from events.language.messages import Command
from events.language.subjects import Layout
from projections.cluster import ClusterState
from tests.store.helpers import SyncHandler
from tests.system.harness import eventually, vm_manifest

WAIT_SECONDS = 10.0
"""Longest any step here may take before the test fails (each is an event away)."""


class SlowWriter(Writer):
    """The control plane's writer, with the VM controller's VMI creation for one VM held
    until the test lets it go: before it is decided (a command stuck behind others), or
    after it is recorded (its answer slow to come back). VMI creations and deletions are
    counted."""

    def __init__(self, *args: object, slow: str, recorded_first: bool = False) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.slow = slow
        self.recorded_first = recorded_first
        self.released = asyncio.Event()
        self.waiting = asyncio.Event()
        """The slow creation waits at its hold."""
        self.creations: Counter[str] = Counter()
        self.deletions: Counter[str] = Counter()
        self.created: dict[str, asyncio.Event] = {}

    async def execute(self, command: Command, announce: Announce = nobody) -> Result:
        creation = command.verb == "create-for-vm"
        if command.kind == "VirtualMachineInstance" and command.verb == "delete":
            self.deletions[command.name] += 1
        if creation:
            self.creations[command.name] += 1
        held = creation and command.name == self.slow
        if held and not self.recorded_first:
            await self.hold()
        result = await super().execute(command, announce)
        if held and self.recorded_first:
            await self.hold()
        if creation:
            self.created.setdefault(command.name, asyncio.Event()).set()
        return result

    async def hold(self) -> None:
        self.waiting.set()
        await self.released.wait()

    async def until_waiting(self) -> None:
        await asyncio.wait_for(self.waiting.wait(), WAIT_SECONDS)

    async def until_created(self, name: str) -> None:
        await asyncio.wait_for(self.created.setdefault(name, asyncio.Event()).wait(),
                               WAIT_SECONDS)


def apply(name: str, labels: dict[str, str] | None = None,
          run_strategy: str = "Always") -> Command:
    manifest = vm_manifest(name, run_strategy)
    manifest["metadata"]["labels"] = labels or {}
    return Command(id=str(uuid.uuid4()), actor="user:erin", kind="VirtualMachine",
                   verb="apply", namespace="default", name=name, manifest=manifest)


@contextlib.asynccontextmanager
async def control_loop(nats_url: str, prefix: str,
                       writer_of: Callable[[Client, Layout], SlowWriter]
                       ) -> AsyncIterator[tuple[ControlLoop, SlowWriter]]:
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-loop-pipelining")
    writer = writer_of(nc, layout)
    loop = ControlLoop(nc, layout, writer, node_grace_seconds=3600)
    # The VM controller alone: no other controller's change (the HyperConverged's defaults
    # being written) has it look at every VM meanwhile.
    loop.controllers[:] = [loop.vms]
    stop = asyncio.Event()
    running = asyncio.ensure_future(loop.run(stop))
    try:
        await asyncio.wait_for(loop.live.wait(), WAIT_SECONDS)
        yield loop, writer
    finally:
        writer.released.set()
        stop.set()
        await running
        await nc.close()


async def accepted(handler: SyncHandler, command: Command) -> list[Event]:
    result = await asyncio.to_thread(handler.execute, command)
    assert result.outcome.accepted, result.outcome.reason
    return [event for _, event in result.events]


class Shown:
    """A controller that decides nothing and keeps what events it was shown."""

    name = "shown"

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def on_event(self, _state: ClusterState, event: Event) -> list[Command]:
        self.ids.add(event.id)
        return []

    def resync(self, _state: ClusterState) -> list[Command]:
        return []


async def test_a_slow_command_holds_back_only_decisions_about_its_own_object(
        handler: SyncHandler, nats_url: str, prefix: str) -> None:
    async with control_loop(nats_url, prefix,
                            lambda nc, layout: SlowWriter(nc, layout, slow="slow")) as (loop, w):
        shown = Shown()  # after the VM controller: what it was shown, that one has decided
        loop.controllers.append(shown)
        await accepted(handler, apply("slow"))
        await w.until_waiting()
        # The slow VM changes while its VMI's creation is in flight: decided on the state
        # without that VMI, it would be created a second time (refused once recorded).
        [changed] = await accepted(handler, apply("slow", labels={"tier": "gold"}))
        await accepted(handler, apply("fast"))
        await w.until_created("fast")  # not behind the slow one's batch
        assert not w.released.is_set() and w.creations["slow"] == 1
        w.released.set()
        await w.until_created("slow")

        async def decided() -> bool:  # the change, held back until now, decided on
            return changed.id in shown.ids

        await eventually(decided, what="the held change shown to the controllers")
        assert w.creations == {"slow": 1, "fast": 1}


async def test_what_was_held_back_is_decided_once_the_command_is_recorded(
        handler: SyncHandler, nats_url: str, prefix: str) -> None:
    def writer_of(nc: Client, layout: Layout) -> SlowWriter:
        return SlowWriter(nc, layout, slow="slow", recorded_first=True)

    async with control_loop(nats_url, prefix, writer_of) as (loop, w):
        shown = Shown()
        loop.controllers.append(shown)
        await accepted(handler, apply("slow"))
        await w.until_waiting()  # its VMI created, the answer not back yet
        [stopped] = await accepted(handler, apply("slow", run_strategy="Halted"))
        await accepted(handler, apply("fast"))
        await w.until_created("fast")  # the stop came meanwhile, and was held back
        assert stopped.id not in shown.ids
        w.released.set()

        async def stopping() -> bool:
            return stopped.id in shown.ids and w.deletions["slow"] > 0

        await eventually(stopping, what="the stop shown, and the VMI deleted")
