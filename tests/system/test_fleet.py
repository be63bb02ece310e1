"""A fleet: many simulated nodes in one process (`python -m nodeagent fleet`), as `virtbus
up` runs them. Each node is sized as asked, has a host of its own (its guests only), and
keeps it across a kill of the whole fleet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.user.client import Client
from events.api.resources import quantity
from tests.system.harness import System, domains, eventually, ready_nodes, vm_manifest, vmi_phase

NODES = 3
VMS = 6
NODE_MEMORY = "16Gi"
VM_MEMORY = "4Gi"
"""More than a test-driver host's own 3Gi: only a sized node takes such a VM."""
NODE_GRACE_SECONDS = 120.0
"""Longer than a fleet takes to start again on a loaded machine: the restart is not a node
failure (which would fail the VMIs, destroy their guests and place new ones)."""


@pytest.fixture
def fleet(nats_url: str, prefix: str, tmp_path: Path) -> Iterator[System]:
    system = System(nats_url, prefix, tmp_path, nodes=NODES, node_grace=NODE_GRACE_SECONDS,
                    fleet=True, node_cpus=8, node_memory=int(quantity(NODE_MEMORY)))
    try:
        system.start_all()
        yield system
    finally:
        system.stop_all()


async def placements(vb: Client) -> dict[str, tuple[str, str]] | None:
    """Each VM's VMI uid and node, once every one runs."""
    vmis = await vb.query("VirtualMachineInstance", "default")
    running = {v["metadata"]["name"]: (v["metadata"]["uid"], v["status"]["nodeName"])
               for v in vmis if v["status"]["phase"] == "Running"}
    return running if len(running) == VMS else None


async def hosts(vb: Client) -> dict[str, set[str]]:
    """The VMI uids whose domains each node's host holds."""
    return {f"node-{i}": {d.uid for d in await domains(vb, f"node-{i}")}
            for i in range(1, NODES + 1)}


def by_node(placed: dict[str, tuple[str, str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {f"node-{i}": set() for i in range(1, NODES + 1)}
    for uid, node in placed.values():
        out[node].add(uid)
    return out


async def test_a_fleet_runs_sized_nodes_each_with_its_own_host(fleet: System) -> None:
    assert [n for n in fleet.args if n.startswith(("node-", "fleet"))] == ["fleet"]
    async with await Client.connect(fleet.nats_url, fleet.prefix, actor="user:alice") as vb:
        nodes = await eventually(lambda: ready_nodes(vb, NODES), what="the fleet's nodes")
        for node in nodes:
            assert node["status"]["capacity"]["cpu"] == "8"
            assert node["status"]["capacity"]["memory"] == NODE_MEMORY
        await vb.apply(*(vm_manifest(f"vm-{i}", memory=VM_MEMORY) for i in range(VMS)))
        placed = await eventually(lambda: placements(vb), what="every VM Running")
        assert await hosts(vb) == by_node(placed)  # each guest on its own node's host only

        fleet.kill("fleet")
        fleet.start("fleet")
        # The restarted fleet's agents adopt their guests: same instances, same nodes.
        await eventually(lambda: vmi_phase(vb, "vm-0", "Running"), what="vm-0 Running")
        assert await eventually(lambda: placements(vb), what="every VM Running") == placed
        assert await eventually(lambda: hosts(vb), what="every node answering") == \
            by_node(placed)
