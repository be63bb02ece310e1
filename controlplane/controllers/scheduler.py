"""The scheduler: binds each Pending VMI to a Ready node with room.

A VMI's ask follows the effective KubeVirt configuration (`cpuAllocationRatio`,
`memoryOvercommit`, from the HyperConverged). A node fits when it is Ready, carries every
`nodeSelector` label, and its allocatable
memory, CPU and extended resources (kvm/tun devices, hugepages) cover what its active VMIs
hold plus this VMI's ask. Among fitting nodes the least-loaded by memory wins (ties by
name), which spreads VMIs as kube-scheduler's default scoring roughly does.
"""

from __future__ import annotations

from controlplane.controllers import derived_command
from events.api.resources import ClusterTuning, VMIResources, quantity, vmi_resources
from events.codec import Event
from events.messages import Command
from events.nodes import NODE_KIND
from events.subjects import split_aggregate_id
from events.vm import VMI_KIND
from projections.cluster import ClusterState
from projections.hco import cluster_tuning
from projections.views import NodeView, VirtualMachineInstanceView

NAME = "scheduler"


class Scheduler:
    name = NAME

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        kind, namespace, name = split_aggregate_id(event.originator_id)
        if kind == VMI_KIND:
            vmi = state.vmi(namespace, name)
            return self._schedule(state, vmi, event.correlation_id) if vmi is not None else []
        if kind == NODE_KIND:
            return self.resync(state)
        return []

    def resync(self, state: ClusterState) -> list[Command]:
        commands: list[Command] = []
        for vmi in list(state.vmis()):
            commands += self._schedule(state, vmi)
        return commands

    def _schedule(self, state: ClusterState, vmi: VirtualMachineInstanceView,
                  correlation_id: str = "") -> list[Command]:
        if vmi.phase != "Pending" or vmi.node or vmi.deletion_requested_at is not None:
            return []
        node = self.choose(state, vmi)
        if node is None:
            return []
        return [derived_command(NAME, "VirtualMachineInstance", "schedule",
                                vmi.metadata.namespace, vmi.metadata.name, vmi.version,
                                manifest={"node": node},
                                correlation_id=correlation_id or vmi.correlation_id)]

    def choose(self, state: ClusterState, vmi: VirtualMachineInstanceView) -> str | None:
        if vmi.spec is None:
            return None  # nothing to place (a log this version cannot fully read)
        best: tuple[float, str] | None = None
        tuning = cluster_tuning(state)
        for node in state.nodes():
            ask = vmi_resources(vmi.spec.domain, emulation=node.emulation, tuning=tuning)
            load = self._fits(state, node, ask, selector=vmi.spec.node_selector, tuning=tuning)
            if load is not None and (best is None or (load, node.name) < best):
                best = (load, node.name)
        return best[1] if best else None

    @staticmethod
    def _fits(state: ClusterState, node: NodeView, ask: VMIResources, *,
              selector: dict[str, str], tuning: ClusterTuning) -> float | None:
        """The node's memory load after placing `ask`, or None if it does not fit."""
        info = node.info
        if not node.ready or info is None:
            return None
        if any(info.labels.get(k) != v for k, v in selector.items()):
            return None
        used = state.node_usage(node.name, emulation=node.emulation, tuning=tuning)
        memory = int(quantity(info.allocatable.get("memory", "0")))
        cpu = int(quantity(info.allocatable.get("cpu", "0")) * 1000)
        if used["memory"] + ask.memory_bytes > memory or used["cpu"] + ask.cpu_millis > cpu:
            return None
        for resource, amount in ask.extended.items():
            have = int(quantity(info.allocatable.get(resource, "0")))
            if used.get(resource, 0) + amount > have:
                return None
        return (used["memory"] + ask.memory_bytes) / memory if memory else 1.0
