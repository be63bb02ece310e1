"""A controller acting on an object later (after a replay, or when a node appears) carries
the correlation id of the request that last changed the object, not one of its own."""

from __future__ import annotations

import uuid

from controlplane.controllers.scheduler import Scheduler
from controlplane.controllers.vm import VMController
from controlplane.handling import CommandHandler
from events.messages import Command
from projections.cluster import ClusterState
from tests.system.harness import vm_manifest

NODE = {"nodeName": "n1", "hostname": "n1", "architecture": "x86_64",
        "hypervisorUri": "test:///default", "domainType": "qemu", "libvirtVersion": "10.0.0",
        "capacity": {"cpu": "8", "memory": "16Gi"},
        "allocatable": {"cpu": "8", "memory": "16Gi", "devices.kubevirt.io/kvm": "110",
                        "devices.kubevirt.io/tun": "110"}}


def run(handler: CommandHandler, state: ClusterState, command: Command) -> None:
    result = handler.execute(command)
    assert result.outcome.accepted, result.outcome.reason
    for sequence, event in result.events:
        state.apply(event, sequence)


def test_resyncs_carry_the_request_that_last_changed_the_object(
        handler: CommandHandler) -> None:
    state = ClusterState()
    apply = Command(id=str(uuid.uuid4()), actor="user:erin", kind="VirtualMachine",
                    verb="apply", namespace="default", name="web", manifest=vm_manifest("web"))
    run(handler, state, apply)
    [create] = VMController().resync(state)
    assert (create.verb, create.correlation_id) == ("create-for-vm", apply.id)
    run(handler, state, create)
    assert Scheduler().resync(state) == []  # no node yet
    run(handler, state, Command(id=str(uuid.uuid4()), actor="system:node:n1", kind="Node",
                                verb="register", name="n1", manifest=NODE))
    [schedule] = Scheduler().resync(state)
    assert schedule.manifest == {"node": "n1"}
    assert schedule.correlation_id == apply.id
