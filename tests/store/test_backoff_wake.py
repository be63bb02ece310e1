"""The control loop wakes the VM controller when a crash-loop backoff runs out: no event marks
that moment, so the loop asks on its clock, from what the log says. A control plane started
anew (the read model replayed, no memory of timers) still starts the VM when its time
comes."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import msgspec

from controlplane.loop import ControlLoop
from controlplane.writer import Writer
from events.jetstream.connect import connect
from events.language.messages import Command, DomainObservation, node_actor
from events.language.subjects import Layout
from projections.kinds.vm import VirtualMachineInstanceView, VirtualMachineView
from tests.store.helpers import SyncHandler, register_command
from tests.system.harness import eventually, vm_manifest


class Clock:
    """Now, moved on by the test."""

    def __init__(self) -> None:
        self.shift = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.shift


async def execute(handler: SyncHandler, command: Command) -> None:
    result = await asyncio.to_thread(handler.execute, command)
    assert result.outcome.accepted, result.outcome.reason


async def test_a_backoff_ends_on_the_clock_also_after_a_restart(
        handler: SyncHandler, nats_url: str, prefix: str) -> None:
    layout = Layout(prefix)
    clock = Clock()
    nc = await connect(nats_url, "test-backoff-wake")

    def start_loop() -> tuple[ControlLoop, asyncio.Event, asyncio.Future[None]]:
        loop = ControlLoop(nc, layout, Writer(nc, layout), node_grace_seconds=3600)
        loop.vms.clock = clock
        stop = asyncio.Event()
        return loop, stop, asyncio.ensure_future(loop.run(stop))

    async def vmi_of(loop: ControlLoop) -> VirtualMachineInstanceView | None:
        return loop.state.vmi("default", "phoenix")

    async def backing_off(loop: ControlLoop) -> VirtualMachineView | None:
        vm = loop.state.vm("default", "phoenix")
        gone = loop.state.vmi("default", "phoenix") is None
        return vm if vm is not None and vm.start_failure is not None and gone else None

    loop, stop, running = start_loop()
    try:
        await execute(handler, register_command("n1"))
        await execute(handler, Command(id=str(uuid.uuid4()), actor="user:erin",
                                       kind="VirtualMachine", verb="apply",
                                       namespace="default", name="phoenix",
                                       manifest=vm_manifest("phoenix")))
        vmi = await eventually(lambda: _scheduled(loop), what="the VMI scheduled")
        obs = DomainObservation(namespace="default", name="phoenix", uid=vmi.uid,
                                phase="Scheduled", gone=True)
        await execute(handler, Command(
            id=str(uuid.uuid4()), actor=node_actor("n1"), kind="VirtualMachineInstance",
            verb="observe", namespace="default", name="phoenix",
            manifest=msgspec.to_builtins(obs)))  # its domain vanished before it ran
        vm = await eventually(lambda: backing_off(loop), what="a start failure counted")
        assert vm.start_failure is not None
        retry_after = vm.start_failure.retry_after
    finally:
        stop.set()
        await running

    # A new control plane, before the retry is due: it replays, and waits.
    loop, stop, running = start_loop()
    try:
        await loop.live.wait()
        assert await backing_off(loop) is not None
        clock.shift = retry_after - datetime.now(UTC)
        again = await eventually(lambda: vmi_of(loop), what="a VMI once the backoff ran out")
        assert again.uid != vmi.uid
    finally:
        stop.set()
        await running
        await nc.close()


async def _scheduled(loop: ControlLoop) -> VirtualMachineInstanceView | None:
    vmi = loop.state.vmi("default", "phoenix")
    return vmi if vmi is not None and vmi.node else None
