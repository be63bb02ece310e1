"""What every node holds, kept up to date by folding VMI and node changes one at a time, so
a decision costs a loop over the nodes and never a walk over every VMI.

A VMI holds its ask on its node and, while a migration is in flight, on the migration's
target (as KubeVirt's target pod does). A decision's placement is counted at once
(`place`), so the next decision sees the node taken even before the log says so: VMIs
started together never over-commit a node. Whenever the read model changes a VMI, what it
holds is derived again from the view (`hold`), which replaces any such placement.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controlplane.scheduling.facts import Demand, NodeFacts, PodOnNode, Usage
from events.api.resources import ClusterTuning, VMIResources, vmi_resources
from events.api.vm import VirtualMachineInstanceSpec
from projections.kinds.vm import NodeView, VirtualMachineInstanceView


@dataclass(frozen=True, slots=True)
class Held:
    """What one VMI holds: its ask on each node it occupies, from the spec it had then."""

    spec: VirtualMachineInstanceSpec | None
    on: tuple[tuple[str, VMIResources], ...]
    pod: PodOnNode


class Ledger:
    """The nodes (`facts`, and `nodes` sorted by name) and what each holds (`usage`)."""

    def __init__(self, tuning: ClusterTuning) -> None:
        self.tuning = tuning
        self.facts: dict[str, NodeFacts] = {}
        self.nodes: list[NodeFacts] = []
        self.usage: dict[str, Usage] = {}
        self._held: dict[str, Held] = {}
        self._anti_affinity_pods = 0
        self.node_verdicts: dict[bytes, list[Sequence[str]]] = {}
        """What the filters that read only the node say of each of `nodes`, by the node
        demands of a VMI (`Demand.node_key`): the same for every VMI that demands the same,
        until a node changes."""

    @classmethod
    def of(cls, nodes: Iterable[NodeView], vmis: Iterable[VirtualMachineInstanceView],
           tuning: ClusterTuning) -> Ledger:
        """A ledger built from the read model as it stands."""
        ledger = cls(tuning)
        for node in nodes:
            if node.info is not None:
                ledger.facts[node.name] = NodeFacts.of(node)
                ledger.usage[node.name] = Usage()
        ledger._sort()
        for vmi in vmis:
            ledger.hold(vmi)
        return ledger

    @property
    def anti_affinity_placed(self) -> bool:
        """Whether some placed VMI keeps others away: then every decision must look."""
        return self._anti_affinity_pods > 0

    def update_node(self, node: NodeView) -> bool:
        """Fold a node's change in; False when what its VMIs hold must be worked out again
        (the node appeared without its VMIs, went away, or switched KVM on or off): then
        the ledger is to be built again from the read model."""
        known = self.facts.get(node.name)
        if node.info is None or not node.exists:
            return known is None
        if known is None:
            return False
        if known.version == node.version:
            return True
        facts = NodeFacts.of(node)
        if known.emulation != facts.emulation and self.usage[node.name].pods:
            return False
        self.facts[node.name] = facts
        self._sort()
        return True

    def hold(self, vmi: VirtualMachineInstanceView) -> None:
        """What `vmi` holds now, as the read model says, in place of what it held before."""
        spec = vmi.spec
        on = () if spec is None or not vmi.active else tuple(
            name for name in (vmi.node, vmi.migration_target) if name and name in self.facts)
        held = self._held.get(vmi.id)
        if held is not None and held.spec is spec and tuple(n for n, _ in held.on) == on:
            return
        self.release(vmi.id)
        if spec is None or not on:
            return
        anti = spec.affinity.pod_anti_affinity if spec.affinity else None
        pod = PodOnNode(vmi.metadata.namespace, vmi.metadata.labels, tuple(
            anti.required_during_scheduling_ignored_during_execution if anti else ()))
        self._add(vmi.id, Held(spec, tuple(
            (name, vmi_resources(spec.domain, emulation=self.facts[name].emulation,
                                 tuning=self.tuning)) for name in on), pod))

    def place(self, node: str, demand: Demand) -> None:
        """Count `demand` on `node` at once, besides what its VMI holds already (a
        migration's source): the next decision sees it."""
        held = self._held.get(demand.holder)
        self.release(demand.holder)
        ask = demand.asks[self.facts[node].emulation]
        on = (*(p for p in (held.on if held is not None else ()) if p[0] != node),
              (node, ask))
        self._add(demand.holder, Held(held.spec if held is not None else None, on,
                                      demand.pod()))

    def release(self, holder: str) -> None:
        """Forget what `holder` holds."""
        held = self._held.pop(holder, None)
        if held is None:
            return
        for name, ask in held.on:
            usage = self.usage.get(name)
            if usage is not None:
                usage.remove(holder, ask)
        self._anti_affinity_pods -= bool(held.pod.anti_affinity)

    def _add(self, holder: str, held: Held) -> None:
        self._held[holder] = held
        for name, ask in held.on:
            self.usage[name].add(holder, ask, held.pod)
        self._anti_affinity_pods += bool(held.pod.anti_affinity)

    def _sort(self) -> None:
        self.nodes = sorted(self.facts.values(), key=lambda f: f.name)
        self.node_verdicts = {}
