"""The read side's Node: what its VMIs hold is counted under the node's own name, also when
that name is not a subject-safe token (a host's FQDN)."""

from __future__ import annotations

import uuid

from controlplane.controllers.scheduler import Scheduler
from controlplane.controllers.vm import VMController
from controlplane.handling import CommandHandler
from events.messages import Command
from projections.cluster import ClusterState
from projections.service import node_object
from tests.system.harness import vm_manifest

HOST = "worker-1.example.com"
NODE = {"nodeName": HOST, "hostname": HOST, "architecture": "x86_64",
        "hypervisorUri": "test:///default", "domainType": "qemu", "libvirtVersion": "10.0.0",
        "capacity": {"cpu": "8", "memory": "16Gi"},
        "allocatable": {"cpu": "8", "memory": "16Gi", "devices.kubevirt.io/kvm": "110",
                        "devices.kubevirt.io/tun": "110"}}


def run(handler: CommandHandler, state: ClusterState, command: Command) -> None:
    result = handler.execute(command)
    assert result.outcome.accepted, result.outcome.reason
    for sequence, event in result.events:
        state.apply(event, sequence)


def test_a_node_with_a_dotted_name_counts_its_vmis(handler: CommandHandler) -> None:
    state = ClusterState()
    run(handler, state, Command(id=str(uuid.uuid4()), actor=f"system:node:{HOST}", kind="Node",
                                verb="register", name=HOST, manifest=NODE))
    run(handler, state, Command(id=str(uuid.uuid4()), actor="user:erin", kind="VirtualMachine",
                                verb="apply", namespace="default", name="web",
                                manifest=vm_manifest("web")))
    [create] = VMController().resync(state)
    run(handler, state, create)
    [schedule] = Scheduler().resync(state)
    assert schedule.manifest == {"node": HOST}
    run(handler, state, schedule)
    [node] = state.nodes()
    obj = node_object(state, node)
    assert obj["metadata"]["name"] == HOST
    assert obj["status"]["allocated"]["vmis"] == "1"
