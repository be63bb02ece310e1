"""Drain commands: `drain` from operators (kubectl's verb: cordon, then evict everything),
and from the evacuation controller `drained` (the node holds nothing it can evict) and
`evacuate` (an `External` VMI is marked for someone else to move)."""

from __future__ import annotations

import msgspec

from controlplane.decision import Decision, Rejected, handles
from controlplane.node.commands import existing_node
from events.language.kinds.migration import VirtualMachineInstanceEvacuationRequested
from events.language.kinds.nodes import NodeDrained, NodeDrainRequested
from events.language.kinds.vm import VMI_KIND
from projections.kinds.vm import VirtualMachineInstanceView


class EvacuateBody(msgspec.Struct, frozen=True, kw_only=True):
    node: str


@handles("Node", "drain")
def drain(d: Decision) -> None:
    """Accepted with no event while the node drains already: the first drain's
    correlation id stays the one every eviction carries."""
    node = existing_node(d)
    if not node.state.draining:
        d.trigger(node, NodeDrainRequested)


@handles("Node", "drained", internal=True)
def drained(d: Decision) -> None:
    node = existing_node(d)
    if not node.state.draining:
        raise Rejected("not draining")
    d.trigger(node, NodeDrained)


@handles("VirtualMachineInstance", "evacuate", internal=True)
def evacuate(d: Decision) -> None:
    vmi = d.existing(VMI_KIND, VirtualMachineInstanceView, "virtualmachineinstance")
    node = d.body(EvacuateBody).node
    if vmi.state.node != node or not vmi.state.active:
        raise Rejected("the VMI is no longer on the node")
    if vmi.state.evacuation_node != node:
        d.trigger(vmi, VirtualMachineInstanceEvacuationRequested, node=node)
