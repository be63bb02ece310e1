"""Stopping everything, nats-server included, and starting again on the same data directory
gives the same state: every read model is a function of the log alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controlplane.client import Client
from events.server import EmbeddedNats
from tests.system.harness import System, eventually, ready_nodes, vm_manifest, vmi_phase

KINDS = ("VirtualMachine", "VirtualMachineInstance", "Node")


async def snapshot(vb: Client, after: int) -> dict[str, list[dict[str, Any]]]:
    return {kind: await vb.query(kind, after=after) for kind in KINDS}


async def test_same_data_directory_gives_the_same_state(tmp_path: Path, prefix: str) -> None:
    server = EmbeddedNats(tmp_path / "nats").start()
    system = System(server.url, prefix, tmp_path)
    system.start_all()
    try:
        async with await Client.connect(server.url, prefix, actor="user:bob") as vb:
            await eventually(lambda: ready_nodes(vb, 2), what="nodes")
            await vb.apply(vm_manifest("a"), vm_manifest("b", "Halted"), vm_manifest("c"))
            await eventually(lambda: vmi_phase(vb, "a", "Running"), what="a Running")
            await eventually(lambda: vmi_phase(vb, "c", "Running"), what="c Running")
            await vb.act("VirtualMachine", "stop", "default", "c")
            await eventually(lambda: _gone(vb, "c"), what="c stopped")
            info = await vb.js.stream_info(vb.layout.events_stream)
            head = int(info.state.last_seq)
            before = await snapshot(vb, head)
            replayed = await vb.query_at(head, "VirtualMachine")
    finally:
        system.stop_all()
        server.stop()

    assert before["VirtualMachine"] == replayed  # point-in-time replay agrees with the service
    server = EmbeddedNats(tmp_path / "nats", port=server.port).start()
    system.start("projections")
    try:
        async with await Client.connect(server.url, prefix) as vb:
            after = await eventually(lambda: snapshot(vb, head), what="rebuilt read model")
            assert after == before
            assert [o["metadata"]["name"] for o in after["VirtualMachine"]] == ["a", "b", "c"]
    finally:
        system.stop_all()
        server.stop()


async def _gone(vb: Client, name: str) -> bool:
    return await vb.query("VirtualMachineInstance", "default", name) == []
