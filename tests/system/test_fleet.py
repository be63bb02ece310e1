"""A fleet: many simulated nodes in one process (`python -m nodeagent fleet`), as `virtbus
up` runs them. Each node is sized as asked, has a host of its own (its guests only), and
keeps it across a kill of the whole fleet. A fleet down past the nodes' grace leaves every
node NotReady: the control plane fails none of their VMIs (kube's master disruption mode),
and the fleet back finds them all where they were."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.user.client import Client
from events.api.resources import quantity
from tests.system.harness import (
    System,
    domains,
    eventually,
    node_ready,
    ready_nodes,
    vm_manifest,
    vmi_phase,
)

NODES = 3
VMS = 6
NODE_MEMORY = "16Gi"
VM_MEMORY = "4Gi"
"""More than a test-driver host's own 3Gi: only a sized node takes such a VM."""
NODE_GRACE_SECONDS = 10.0
"""Longer than a heartbeat a loaded machine delays (the nodes stay Ready while the fleet
runs); the fleet stays down past it."""
HELD = "VMIs of a lost node not failed: every node is NotReady (master disruption mode)"


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
        for node in hosts_of(placed):
            await eventually(lambda n=node: node_ready(vb, n, False), what=f"{node} NotReady")
        await eventually(lambda: held(fleet, hosts_of(placed)), what="every node's VMIs held")
        fleet.start("fleet")
        # The restarted fleet's agents adopt their guests: same instances, same nodes.
        await eventually(lambda: vmi_phase(vb, "vm-0", "Running"), what="vm-0 Running")
        assert await eventually(lambda: placements(vb), what="every VM Running") == placed
        assert await eventually(lambda: hosts(vb), what="every node answering") == \
            by_node(placed)
        for i in range(VMS):
            phases = [c["value"] for e in
                      await vb.history("VirtualMachineInstance", "default", f"vm-{i}")
                      for c in e.changes if c["path"] == "/status/phase"]
            assert "Failed" not in phases, f"vm-{i}"


def hosts_of(placed: dict[str, tuple[str, str]]) -> set[str]:
    return {node for _, node in placed.values()}


async def held(system: System, nodes: set[str]) -> bool:
    """Whether the control plane's log says the VMIs of each of `nodes` were held, past
    the moment they would have been failed were any node Ready."""
    log = system.logs / "controlplane.log"
    lines = (json.loads(line) for line in log.read_text().splitlines() if line.startswith("{"))
    return {line["node"] for line in lines if line.get("event") == HELD} == nodes
