"""The evacuation controller: empties each draining node, VMI by VMI, by eviction strategy
(the VMI's `spec.evictionStrategy`, else the cluster's: the effective KubeVirt's, which HCO
sets to LiveMigrate on a multi-node cluster and None on a single node).

| strategy              | the VMI can live-migrate  | it cannot                           |
|-----------------------|---------------------------|-------------------------------------|
| LiveMigrate           | an evacuation migration   | blocked: the drain waits, and says  |
|                       |                           | why (the LiveMigratable reason)     |
| LiveMigrateIfPossible | an evacuation migration   | shut down (the VMI deleted; its VM's|
|                       |                           | run strategy starts it elsewhere)   |
| None                  | shut down                 | shut down                           |
| External              | marked (`status.evacuationNodeName`); someone else moves it     |

A VMI with a migration in flight is left to it; one whose migration failed gets a new one.
The drain ends (`NodeDrained`) when the node holds only marked External VMIs, or nothing.
Every command carries the drain's correlation id, so `virtbus history --correlation ID`
lists every migration and eviction one drain caused.
"""

from __future__ import annotations

from controlplane.controllers import derived_command
from events.codec import Event
from events.messages import Command
from events.migration import MIGRATION_KIND
from events.nodes import NODE_KIND
from events.subjects import split_aggregate_id
from events.vm import VMI_KIND
from projections.cluster import ClusterState
from projections.eviction import eviction_strategy, migrating
from projections.hco import HCO_VIEW_KINDS
from projections.migratable import not_migratable
from projections.views import NodeView, VirtualMachineInstanceView

NAME = "evacuation"
class EvacuationController:
    name = NAME

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        kind = split_aggregate_id(event.originator_id)[0]
        if kind in (NODE_KIND, VMI_KIND, MIGRATION_KIND) or kind in HCO_VIEW_KINDS:
            return self.resync(state)
        return []

    def resync(self, state: ClusterState) -> list[Command]:
        return [c for node in state.nodes() if node.draining for c in self.drain(state, node)]

    def drain(self, state: ClusterState, node: NodeView) -> list[Command]:
        correlation = node.correlation_id
        out: list[Command] = []
        left = 0
        for vmi in state.vmis_on(node.name):
            meta = vmi.metadata

            def command(kind: str, verb: str, manifest: dict[str, object] | None = None,
                        vmi: VirtualMachineInstanceView = vmi) -> Command:
                return derived_command(NAME, kind, verb, vmi.metadata.namespace,
                                       vmi.metadata.name, vmi.uid, vmi.version,
                                       manifest=manifest, correlation_id=correlation)

            strategy = eviction_strategy(state, vmi)
            if strategy == "External":
                if vmi.evacuation_node != node.name:
                    out.append(command("VirtualMachineInstance", "evacuate",
                                       {"node": node.name}))
                    left += 1
                continue
            left += 1
            if vmi.deletion_requested_at is not None or migrating(state, vmi):
                continue
            can_migrate = vmi.spec is not None and not_migratable(
                vmi.spec, meta.annotations) is None
            match strategy:
                case "LiveMigrate" | "LiveMigrateIfPossible" if can_migrate:
                    out.append(command("VirtualMachineInstanceMigration",
                                       "create-for-evacuation",
                                       {"vmi_name": meta.name, "node": node.name}))
                case "LiveMigrate":
                    pass  # blocked: `blocked_reason` says why
                case _:
                    out.append(command("VirtualMachineInstance", "delete"))
        if not left:
            out.append(derived_command(NAME, "Node", "drained", "", node.name, node.version,
                                       correlation_id=correlation))
        return out
