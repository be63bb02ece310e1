"""The scheduler controller: binds each Pending VMI to a node, or says why none fits.

The decision is `controlplane.scheduling.decide` (kube-scheduler's filters and scores, with
KubeVirt's CPU node selectors and the HyperConverged's `workloads.nodePlacement`). A VMI no
node fits gets `unschedulable` with kube-scheduler's message, only when the message changes,
so a resync appends nothing new. It is decided again whenever something could make a node
fit: a node's change (registration, labels, taints, cordon, readiness), a VMI that frees
what it held, a change of the cluster configuration.

What each node holds and the VMIs waiting are folded from the read model's changes as they
happen (its observers), so a decision costs a loop over the nodes, whatever the number of
VMIs; each placement is counted in the ledger at once, so VMIs started together never
over-commit a node. A resync builds both again from the read model.
"""

from __future__ import annotations

import msgspec
import structlog

from controlplane.controllers import derived_command
from controlplane.defaults import SCHEDULER_TIE_BREAK_SEED
from controlplane.scheduling import decide
from controlplane.scheduling.facts import demand_of
from controlplane.scheduling.ledger import Ledger
from events.api.hco import NodePlacement
from events.api.resources import ClusterTuning
from events.language.codec import Event
from events.language.kinds.nodes import NODE_KIND
from events.language.kinds.vm import VMI_KIND
from events.language.messages import Command
from events.language.subjects import split_aggregate_id
from projections.cluster import ClusterState
from projections.hco import cluster_tuning, effective_kubevirt
from projections.kinds.hco import HCO_TOKENS
from projections.kinds.vm import NodeView, VirtualMachineInstanceView
from projections.views import View

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
        self._state: ClusterState | None = None
        """The read model this scheduler observes."""
        self._ledger: Ledger | None = None
        """None: to be built again from the read model before the next decision."""
        self._config: tuple[ClusterTuning, NodePlacement | None] | None = None
        self._waiting: dict[str, VirtualMachineInstanceView] = {}
        """The VMIs to place, by aggregate id, in the order they came to wait."""
        self._passed_all = False
        """Every waiting VMI was decided, and the read model has not changed since."""

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        if state is not self._state:
            return self.resync(state)
        kind, namespace, name = split_aggregate_id(event.originator_id)
        if kind == VMI_KIND:
            vmi = state.vmi(namespace, name)
            if vmi is not None and vmi.id in self._waiting:
                return self._pass(state, [vmi], event.correlation_id)
            if vmi is None or not vmi.active:  # what it held is free: others may fit now
                return self._pass_all(state)
            return []
        if kind == NODE_KIND or kind in HCO_TOKENS:
            return self._pass_all(state)
        return []

    def _pass_all(self, state: ClusterState) -> list[Command]:
        """Every waiting VMI decided, unless that was done on the state as it still is (a
        batch of a thousand failed VMIs, or of every node's change, decides them all once,
        not once per event: the same decisions on the same state)."""
        if self._passed_all:
            return []
        commands = self._pass(state, list(self._waiting.values()))
        self._passed_all = True
        return commands

    def resync(self, state: ClusterState) -> list[Command]:
        """Everything built again from `state`, which is observed from now on; every
        waiting VMI decided."""
        if state is not self._state:
            if self._state is not None:
                self._state.observers.remove(self._observe)
            state.observers.append(self._observe)
            self._state = state
        self._ledger = self._config = None
        self._waiting = {v.id: v for v in state.vmis() if waiting(v)}
        self._passed_all = False
        return self._pass_all(state)

    def ledger(self, state: ClusterState, tuning: ClusterTuning) -> Ledger:
        """What each node holds, as folded so far (built from `state` where it must be)."""
        if self._ledger is None or self._ledger.tuning != tuning:
            self._ledger = Ledger.of(state.nodes(), state.vmis(), tuning)
        return self._ledger

    def _observe(self, view: View) -> None:
        """Fold one change of the read model in."""
        self._passed_all = False
        if isinstance(view, VirtualMachineInstanceView):
            if waiting(view):
                self._waiting.setdefault(view.id, view)
            else:
                self._waiting.pop(view.id, None)
            if self._ledger is not None:
                self._ledger.hold(view)
        elif isinstance(view, NodeView):
            if self._ledger is not None and not self._ledger.update_node(view):
                self._ledger = None
        elif split_aggregate_id(view.id)[0] in HCO_TOKENS:
            self._config = None

    def _pass(self, state: ClusterState, vmis: list[VirtualMachineInstanceView],
              correlation_id: str = "") -> list[Command]:
        if not vmis:
            return []
        if self._config is None:
            self._config = cluster_tuning(state), workload_placement(state)
        tuning, placement = self._config
        ledger = self.ledger(state, tuning)
        commands: list[Command] = []
        for vmi in vmis:
            spec = vmi.spec
            if spec is None:  # nothing to place
                continue
            ledger.release(vmi.id)  # a placement of an earlier pass that never took
            decided = decide(demand_of(vmi, spec, placement, tuning), ledger, self.seed)
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
