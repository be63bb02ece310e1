"""Stopping everything, nats-server included, and starting again on the same data directory
gives the same state: every read model is a function of the log alone, and the agents'
simulated hosts, kept there too, still hold their guests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from controlplane.user.client import Client
from events.jetstream.server import EmbeddedNats
from tests.system.harness import (
    System,
    eventually,
    hosted,
    last_sequence,
    ready_nodes,
    vm_manifest,
    vm_status,
    vmi_absent,
    vmi_phase,
)

KINDS = ("VirtualMachine", "VirtualMachineInstance", "Node")


async def snapshot(vb: Client, after: int) -> dict[str, list[dict[str, Any]]]:
    return {kind: await vb.query(kind, after=after) for kind in KINDS}


RESTART_NODE_GRACE_SECONDS = 20.0
"""virtbus up's own grace: every process starts again at once, and an agent's first heartbeat
comes only after its interpreter, libvirt and discovery have started (seconds on a busy
machine); a grace shorter than that would fail the guests this module shows adopted."""


@contextlib.asynccontextmanager
async def up_on(data_dir: Path, prefix: str, *, port: int = 0,
                only: str = "") -> AsyncIterator[tuple[int, Client]]:
    """nats-server on `data_dir/nats` and every process (or the one named `only`), as
    `virtbus up` on that data directory, and a client; yields the port to start again on.
    Everything is stopped at the end."""
    server = EmbeddedNats(data_dir / "nats", port=port).start()
    system = System(server.url, prefix, data_dir, node_grace=RESTART_NODE_GRACE_SECONDS)
    if only:
        system.start(only)
    else:
        system.start_all()
    try:
        async with await Client.connect(server.url, prefix, actor="user:bob") as vb:
            yield server.port, vb
    finally:
        system.stop_all()
        server.stop()


async def test_same_data_directory_gives_the_same_state(tmp_path: Path, prefix: str) -> None:
    async with up_on(tmp_path, prefix) as (port, vb):
        await eventually(lambda: ready_nodes(vb, 2), what="nodes")
        await vb.apply(vm_manifest("a"), vm_manifest("b", "Halted"), vm_manifest("c"))
        await eventually(lambda: vmi_phase(vb, "a", "Running"), what="a Running")
        await eventually(lambda: vmi_phase(vb, "c", "Running"), what="c Running")
        await vb.act("VirtualMachine", "stop", "default", "c")
        await eventually(lambda: vmi_absent(vb, "c"), what="c stopped")
        head = await last_sequence(vb)
        before = await snapshot(vb, head)
        replayed = await vb.query_at(head, "VirtualMachine")

    assert before["VirtualMachine"] == replayed  # point-in-time replay agrees with the service
    async with up_on(tmp_path, prefix, port=port, only="projections") as (_, vb):
        after = await eventually(lambda: snapshot(vb, head), what="rebuilt read model")
        assert after == before
        assert [o["metadata"]["name"] for o in after["VirtualMachine"]] == ["a", "b", "c"]


async def test_guests_outlive_a_full_restart(tmp_path: Path, prefix: str) -> None:
    """Every process stopped and started again, as `virtbus up` on the same data directory:
    the guest is adopted where it ran, neither replaced nor launched a second time."""
    async with up_on(tmp_path, prefix) as (port, vb):
        await eventually(lambda: ready_nodes(vb, 2), what="nodes")
        await vb.apply(vm_manifest("a"))
        before = await eventually(lambda: vmi_phase(vb, "a", "Running"), what="a Running")

    async with up_on(tmp_path, prefix, port=port) as (_, vb):
        # An agent takes work only once it has reconciled: the pause shows the guest kept.
        await vb.act("VirtualMachine", "pause", "default", "a")
        await eventually(lambda: vm_status(vb, "a", "Paused"), what="a paused")
        after = await eventually(lambda: vmi_phase(vb, "a", "Running"), what="a Running")
        uid = before["metadata"]["uid"]
        assert (after["metadata"]["uid"], after["status"]["nodeName"]) == \
            (uid, before["status"]["nodeName"])
        # The other agent may still be starting: ask until both answer (not yet listening
        # is an error `eventually` retries), then count.
        guests = await eventually(lambda: hosted(vb, uid), what="both agents' guests")
        assert len(guests) == 1
