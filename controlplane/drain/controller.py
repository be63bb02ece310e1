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
The same eviction applies, without a drain, to each VMI that does not tolerate an
operator's `NoExecute` taint on its node (tolerationSeconds is not honoured: it goes at
once).
The drain ends (`NodeDrained`) when the node holds only marked External VMIs, or nothing.
Every command carries the drain's correlation id, so `virtbus history --correlation ID`
lists every migration and eviction one drain caused.
"""

from __future__ import annotations

from controlplane.controllers import derived_command
from controlplane.controllers.scheduler import workload_placement
from controlplane.scheduling.selectors import tolerates
from events.api.hco import NodePlacement
from events.api.scheduling import Taint
from events.language.codec import Event
from events.language.kinds.migration import MIGRATION_KIND
from events.language.kinds.nodes import NODE_KIND
from events.language.kinds.vm import VMI_KIND
from events.language.messages import Command
from events.language.subjects import split_aggregate_id
from projections.cluster import ClusterState
from projections.eviction import eviction_strategy, migrating
from projections.kinds.hco import HCO_TOKENS
from projections.kinds.vm import NodeView, VirtualMachineInstanceView
from projections.migratable import not_migratable
from projections.views import View

NAME = "evacuation"
class EvacuationController:
    name = NAME

    def __init__(self) -> None:
        self._state: ClusterState | None = None
        """The read model this controller observes."""
        self._evicting: set[str] = set()
        """The nodes with something to evict (`evicting`), as folded from the read model's
        changes: a VMI's or a migration's change matters only while there is one."""

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        kind = split_aggregate_id(event.originator_id)[0]
        if kind == NODE_KIND or kind in HCO_TOKENS or state is not self._state:
            return self.resync(state)
        if kind in (VMI_KIND, MIGRATION_KIND) and self._evicting:
            return self.resync(state)
        return []

    def resync(self, state: ClusterState) -> list[Command]:
        """Only a draining node, or one with a NoExecute taint, has anything to evict: the
        VMIs are looked at (once, grouped by node) only when there is such a node."""
        if state is not self._state:
            if self._state is not None:
                self._state.observers.remove(self._observe)
            state.observers.append(self._observe)
            self._state = state
        nodes = [n for n in state.nodes() if evicting(n)]
        self._evicting = {n.name for n in nodes}
        if not nodes:
            return []
        placement = workload_placement(state)
        on: dict[str, list[VirtualMachineInstanceView]] = {}
        for vmi in state.vmis():
            if vmi.active:
                on.setdefault(vmi.node, []).append(vmi)
        out: list[Command] = []
        for node in nodes:
            if node.draining:
                out += self.drain(state, node, on.get(node.name, []))
                continue
            for vmi in on.get(node.name, []):
                if untolerated_no_execute(node, vmi, placement) is not None:
                    out += evict(state, vmi, node, node.correlation_id)[0]
        return out

    def _observe(self, view: View) -> None:
        """Fold one change of the read model in: a node's eviction beginning or ending."""
        if isinstance(view, NodeView):
            if view.exists and evicting(view):
                self._evicting.add(view.name)
            else:
                self._evicting.discard(view.name)

    def drain(self, state: ClusterState, node: NodeView,
              vmis: list[VirtualMachineInstanceView]) -> list[Command]:
        out: list[Command] = []
        left = 0
        for vmi in vmis:
            commands, stays = evict(state, vmi, node, node.correlation_id)
            out += commands
            left += stays
        if not left:
            out.append(derived_command(NAME, "Node", "drained", "", node.name, node.version,
                                       correlation_id=node.correlation_id))
        return out


def evicting(node: NodeView) -> bool:
    """Whether `node` has VMIs to evict: it drains, or carries a NoExecute taint."""
    return node.draining or any(t.effect == "NoExecute" for t in node.taints)


def untolerated_no_execute(node: NodeView, vmi: VirtualMachineInstanceView,
                           placement: NodePlacement | None) -> Taint | None:
    """An operator's NoExecute taint on the node that the VMI (with the cluster's workload
    placement) does not tolerate: Kubernetes' taint manager evicts such a pod, and KubeVirt
    turns the eviction into the VMI's eviction strategy. (A NotReady node's taints are the
    node lifecycle's: its VMIs fail.)"""
    if vmi.spec is None:
        return None
    tolerations = [*vmi.spec.tolerations, *(placement.tolerations if placement else ())]
    for taint in node.taints:
        if taint.effect == "NoExecute" and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def evict(state: ClusterState, vmi: VirtualMachineInstanceView, node: NodeView,
          correlation: str) -> tuple[list[Command], bool]:
    """The commands that take `vmi` off `node` by its eviction strategy, and whether it still
    counts as left there (all but a marked External one do)."""
    meta = vmi.metadata

    def command(kind: str, verb: str, manifest: dict[str, object] | None = None) -> Command:
        return derived_command(NAME, kind, verb, meta.namespace, meta.name, vmi.uid,
                               vmi.version, manifest=manifest, correlation_id=correlation)

    strategy = eviction_strategy(state, vmi)
    if strategy == "External":
        if vmi.evacuation_node == node.name:
            return [], False
        return [command("VirtualMachineInstance", "evacuate", {"node": node.name})], True
    if vmi.deletion_requested_at is not None or migrating(state, vmi):
        return [], True
    can_migrate = vmi.spec is not None and not_migratable(vmi.spec, meta.annotations) is None
    match strategy:
        case "LiveMigrate" | "LiveMigrateIfPossible" if can_migrate:
            return [command("VirtualMachineInstanceMigration", "create-for-evacuation",
                            {"vmi_name": meta.name, "node": node.name})], True
        case "LiveMigrate":
            return [], True  # blocked: `blocked_reason` says why
        case _:
            return [command("VirtualMachineInstance", "delete")], True
