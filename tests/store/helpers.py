"""What the store tests share: a node's registration manifest, and executing a command the way
the control loop does (folding its events into a `ClusterState`)."""

from __future__ import annotations

import uuid
from typing import Any

from controlplane.handling import CommandHandler, Result
from events.messages import Command
from projections.cluster import ClusterState


def node_info(name: str, *, devices: bool = True) -> dict[str, Any]:
    """The manifest node `name` registers with; with `devices`, its allocatable counts the
    KVM and TUN devices too."""
    allocatable = {"cpu": "8", "memory": "16Gi"}
    if devices:
        allocatable |= {"devices.kubevirt.io/kvm": "110", "devices.kubevirt.io/tun": "110"}
    return {"nodeName": name, "hostname": name, "architecture": "x86_64",
            "hypervisorUri": "test:///default", "domainType": "qemu", "libvirtVersion": "10.0.0",
            "capacity": {"cpu": "8", "memory": "16Gi"}, "allocatable": allocatable}


def run(handler: CommandHandler, state: ClusterState, command: Command) -> Result:
    """Execute and fold the events into `state`, as the control loop does; the result, whatever
    the outcome (see `run_accepted`)."""
    result = handler.execute(command)
    for sequence, event in result.events:
        state.apply(event, sequence)
    return result


def run_accepted(handler: CommandHandler, state: ClusterState, command: Command) -> Result:
    """`run`, asserting the command is accepted."""
    result = run(handler, state, command)
    assert result.outcome.accepted, result.outcome.reason
    return result


def register_command(name: str, *, devices: bool = True) -> Command:
    """Node `name` registering itself (see `node_info`)."""
    return Command(id=str(uuid.uuid4()), actor="system:node:" + name, kind="Node",
                   verb="register", name=name, manifest=node_info(name, devices=devices))


def register(handler: CommandHandler, name: str) -> list[int]:
    """Register node `name` (without devices); the sequences of its events."""
    result = handler.execute(register_command(name, devices=False))
    assert result.outcome.accepted, result.outcome.reason
    return [sequence for sequence, _ in result.events]
