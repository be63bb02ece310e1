"""The scheduler controller: binds each Pending VMI to a node, or says why none fits.

The decision is `controlplane.scheduling.decide` (kube-scheduler's filters and scores, with
KubeVirt's CPU node selectors and the HyperConverged's `workloads.nodePlacement`). A VMI no
node fits gets `unschedulable` with kube-scheduler's message, only when the message changes,
so a resync appends nothing new. It is decided again whenever something could make a node
fit: a node's change (registration, labels, taints, cordon, readiness), a VMI that frees
what it held, a change of the cluster configuration.

Every pass decides on one `Snapshot`, counting each placement in before the next decision,
so VMIs started together never over-commit a node.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import structlog

from controlplane.controllers import derived_command
from controlplane.defaults import SCHEDULER_TIE_BREAK_SEED
from controlplane.scheduling import decide
from controlplane.scheduling.facts import Snapshot, demand_of
from events.api.hco import NodePlacement
from events.codec import Event
from events.messages import Command
from events.nodes import NODE_KIND
from events.subjects import split_aggregate_id
from events.vm import VMI_KIND
from projections.cluster import ClusterState
from projections.hco import HCO_VIEW_KINDS, cluster_tuning, effective_kubevirt
from projections.views import VirtualMachineInstanceView

log = structlog.get_logger(__name__)

NAME = "scheduler"


def workload_placement(state: ClusterState) -> NodePlacement | None:
    """The effective KubeVirt's `workloads.nodePlacement` (from the HyperConverged's)."""
    raw = ((effective_kubevirt(state) or {}).get("spec", {}).get("workloads") or {}).get(
        "nodePlacement")
    if raw is None:
        return None
    try:
        return msgspec.convert(raw, NodePlacement)
    except msgspec.ValidationError as e:  # HCO validated it; a log that says otherwise
        log.warning("workloads.nodePlacement ignored: it does not decode", error=str(e))
        return None


def waiting(vmi: VirtualMachineInstanceView) -> bool:
    return vmi.phase == "Pending" and not vmi.node and vmi.deletion_requested_at is None


class Scheduler:
    name = NAME

    def __init__(self, seed: int = SCHEDULER_TIE_BREAK_SEED) -> None:
        self.seed = seed
        self._snapshot: Snapshot | None = None

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        kind, namespace, name = split_aggregate_id(event.originator_id)
        if kind == VMI_KIND:
            vmi = state.vmi(namespace, name)
            if vmi is not None and waiting(vmi):
                return self._pass(state, [vmi], event.correlation_id)
            if vmi is None or not vmi.active:  # what it held is free: others may fit now
                return self.resync(state)
            return []
        if kind == NODE_KIND or kind in HCO_VIEW_KINDS:
            return self.resync(state)
        return []

    def resync(self, state: ClusterState) -> list[Command]:
        return self._pass(state, [v for v in state.vmis() if waiting(v)])

    def _pass(self, state: ClusterState, vmis: Iterable[VirtualMachineInstanceView],
              correlation_id: str = "") -> list[Command]:
        pending = [(v, v.spec) for v in vmis if v.spec is not None]  # none: nothing to place
        if not pending:
            return []
        tuning = cluster_tuning(state)
        placement = workload_placement(state)
        snapshot = self._snapshot = Snapshot(state.nodes(), state.vmis(), tuning,
                                             self._snapshot)
        commands: list[Command] = []
        for vmi, spec in pending:
            decided = decide(demand_of(vmi, spec, placement, tuning), snapshot, self.seed)
            meta, correlation = vmi.metadata, correlation_id or vmi.correlation_id
            if decided.node is not None:
                commands.append(derived_command(
                    NAME, "VirtualMachineInstance", "schedule", meta.namespace, meta.name,
                    vmi.version, manifest={"node": decided.node}, correlation_id=correlation))
            elif decided.message != vmi.unschedulable_message:
                commands.append(derived_command(
                    NAME, "VirtualMachineInstance", "unschedulable", meta.namespace, meta.name,
                    vmi.version, decided.message, manifest={"message": decided.message},
                    correlation_id=correlation))
        return commands
