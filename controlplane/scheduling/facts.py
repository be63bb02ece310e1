"""What a scheduling decision reads: each node as the predicates see it (`NodeFacts`,
rebuilt only when the node's version changes), what a node holds (`Usage`, kept by
`ledger.Ledger`), and a VMI's demands (`Demand`), all parsed beforehand so a decision is a
loop over nodes with no parsing in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from events.api.hco import NodePlacement
from events.api.node import (
    CPU_FEATURE_LABEL,
    CPU_MODEL_LABEL,
    HOST_MODEL_CPU_LABEL,
    RESOURCE_CPU,
    RESOURCE_MEMORY,
)
from events.api.resources import ClusterTuning, VMIResources, quantity, vmi_resources
from events.api.scheduling import (
    Affinity,
    NodeSelectorTerm,
    PodAffinityTerm,
    PreferredSchedulingTerm,
    Taint,
    Toleration,
    TopologySpreadConstraint,
    WeightedPodAffinityTerm,
)
from events.api.vm import VirtualMachineInstanceSpec
from events.api.vmi_defaults import cpu_features
from projections.kinds.vm import NodeView, VirtualMachineInstanceView

CPU_MODEL_HOST_MODEL = "host-model"
CPU_MODEL_HOST_PASSTHROUGH = "host-passthrough"
FEATURE_POLICIES_NEEDING_LABEL = frozenset({"", "require", "force"})
FEATURE_POLICY_FORBID = "forbid"
_encode = msgspec.msgpack.Encoder().encode
DEFAULT_TOLERATIONS = (
    Toleration(key="node.kubernetes.io/not-ready", operator="Exists", effect="NoExecute",
               toleration_seconds=300),
    Toleration(key="node.kubernetes.io/unreachable", operator="Exists", effect="NoExecute",
               toleration_seconds=300),
)
"""What Kubernetes' DefaultTolerationSeconds admission adds to every pod: a VMI placed
already rides out a short NotReady; a new one is still kept off by the NoSchedule taints."""


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """A node as the predicates read it; rebuilt only when the node's version changes."""

    name: str
    version: int
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    emulation: bool
    allocatable: dict[str, int]
    """cpu in millicores, memory in bytes, pods, and every extended resource."""
    has_host_model: bool
    obsolete_host_model: bool
    """The node names its host CPU and publishes no host-model label for it (the model is
    obsolete): KubeVirt keeps host-model VMIs off it."""

    @classmethod
    def of(cls, node: NodeView) -> NodeFacts:
        info = node.info
        allocatable: dict[str, int] = {}
        host_cpu = ""
        if info is not None:
            host_cpu = info.host_cpu_model
            for resource, amount in info.allocatable.items():
                scale = 1000 if resource == RESOURCE_CPU else 1
                allocatable[resource] = int(quantity(amount) * scale)
        labels = node.all_labels
        has_host_model = any(key.startswith(HOST_MODEL_CPU_LABEL) for key in labels)
        return cls(name=node.name, version=node.version, labels=labels,
                   taints=tuple(node.all_taints), unschedulable=node.unschedulable,
                   emulation=node.emulation, allocatable=allocatable,
                   has_host_model=has_host_model,
                   obsolete_host_model=bool(host_cpu)
                   and HOST_MODEL_CPU_LABEL + host_cpu not in labels)


@dataclass(slots=True)
class PodOnNode:
    """A VMI's launcher pod as pod (anti-)affinity and topology spread see it."""

    namespace: str
    labels: dict[str, str]
    anti_affinity: tuple[PodAffinityTerm, ...] = ()


@dataclass(slots=True)
class Usage:
    """What a node holds: the same units as `NodeFacts.allocatable`, and its pods by the
    VMI that holds them (its aggregate id)."""

    amounts: dict[str, int] = field(default_factory=dict)
    pods: dict[str, PodOnNode] = field(default_factory=dict)

    def add(self, holder: str, ask: VMIResources, pod: PodOnNode) -> None:
        self._count(ask, 1)
        self.pods[holder] = pod

    def remove(self, holder: str, ask: VMIResources) -> None:
        self._count(ask, -1)
        del self.pods[holder]

    def _count(self, ask: VMIResources, sign: int) -> None:
        amounts = self.amounts
        amounts[RESOURCE_CPU] = amounts.get(RESOURCE_CPU, 0) + sign * ask.cpu_millis
        amounts[RESOURCE_MEMORY] = amounts.get(RESOURCE_MEMORY, 0) + sign * ask.memory_bytes
        for resource, amount in ask.extended.items():
            amounts[resource] = amounts.get(resource, 0) + sign * amount

    def pod_count(self) -> int:
        return len(self.pods)


@dataclass(frozen=True, slots=True)
class Demand:
    """A VMI's demands on a node, derived once per decision: its own nodeSelector, affinity
    and tolerations, the HyperConverged's `workloads.nodePlacement`, and the node selector
    and affinity KubeVirt renders from its CPU (`nodeselectorrenderer.go`)."""

    holder: str
    """The VMI's aggregate id: what a placement is counted under."""
    uid: str
    namespace: str
    labels: dict[str, str]
    node_selector: dict[str, str]
    required_terms: tuple[tuple[NodeSelectorTerm, ...], ...]
    """Groups that must all hold; within a group, one term must."""
    absent_labels: tuple[str, ...]
    """Labels the node must not have (a CPU feature with policy `forbid`)."""
    host_model: bool
    """The CPU model is `host-model`: the node must publish its host-model label."""
    avoid_obsolete_host_model: bool
    """No model named: KubeVirt's host-model default, kept off obsolete host CPUs."""
    preferred_terms: tuple[PreferredSchedulingTerm, ...]
    tolerations: tuple[Toleration, ...]
    pod_affinity: tuple[PodAffinityTerm, ...]
    pod_anti_affinity: tuple[PodAffinityTerm, ...]
    preferred_pod_affinity: tuple[WeightedPodAffinityTerm, ...]
    preferred_pod_anti_affinity: tuple[WeightedPodAffinityTerm, ...]
    spread: tuple[TopologySpreadConstraint, ...]
    asks: dict[bool, VMIResources]
    """The resource ask on a node without (True) and with KVM (False)."""
    fit_checks: dict[bool, tuple[tuple[str, int], ...]]
    """The same asks as NodeResourcesFit checks them: cpu, memory, then each extended
    resource by name, only those asked for."""

    def pod(self) -> PodOnNode:
        return PodOnNode(self.namespace, self.labels, self.pod_anti_affinity)

    def node_key(self) -> bytes:
        """What the filters that read only the node look at, encoded: VMIs with the same
        key fit the same nodes as far as those filters go."""
        return _encode((self.node_selector, self.required_terms, self.absent_labels,
                        self.host_model, self.avoid_obsolete_host_model, self.tolerations))


def _placement_affinity(placement: NodePlacement | None) -> Affinity | None:
    if placement is None or placement.affinity is None:
        return None
    return msgspec.convert(placement.affinity, Affinity)


def _cpu_demands(spec: VirtualMachineInstanceSpec) -> tuple[dict[str, str], tuple[str, ...],
                                                              str]:
    """Labels KubeVirt's node selector renderer requires and forbids for the VMI's CPU,
    and its model; the features are the defaulted ones (evmcs adds `vmx`)."""
    cpu, hypervisor = spec.domain.cpu, spec.domain.features
    features = cpu_features(cpu, hypervisor.hyperv if hypervisor is not None else None)
    model = cpu.model if cpu is not None else ""
    required: dict[str, str] = {}
    if model and model not in (CPU_MODEL_HOST_MODEL, CPU_MODEL_HOST_PASSTHROUGH):
        required[CPU_MODEL_LABEL + model] = "true"
    for feature in features:
        if feature.policy in FEATURE_POLICIES_NEEDING_LABEL:
            required[CPU_FEATURE_LABEL + feature.name] = "true"
    forbidden = tuple(CPU_FEATURE_LABEL + f.name for f in features
                      if f.policy == FEATURE_POLICY_FORBID)
    return required, forbidden, model


def demand_of(vmi: VirtualMachineInstanceView, spec: VirtualMachineInstanceSpec,
              placement: NodePlacement | None, tuning: ClusterTuning) -> Demand:
    """Everything `vmi` demands of a node. The cluster's placement (HCO's workloads) adds to
    the VMI's own: its selector and required terms must hold too, its tolerations apply."""
    cpu_labels, forbidden, model = _cpu_demands(spec)
    affinity = spec.affinity or Affinity()
    cluster = _placement_affinity(placement)
    node_affinities = [a.node_affinity for a in (affinity, cluster)
                       if a is not None and a.node_affinity is not None]
    required = tuple(tuple(n.required_during_scheduling_ignored_during_execution
                           .node_selector_terms)
                     for n in node_affinities
                     if n.required_during_scheduling_ignored_during_execution is not None)
    preferred = tuple(t for n in node_affinities
                      for t in n.preferred_during_scheduling_ignored_during_execution)
    selector = {**(placement.node_selector if placement else {}), **spec.node_selector,
                **cpu_labels}
    tolerations = (*spec.tolerations, *(placement.tolerations if placement else ()),
                   *DEFAULT_TOLERATIONS)
    pod_affinity = affinity.pod_affinity
    anti = affinity.pod_anti_affinity
    asks = {emulation: vmi_resources(spec.domain, emulation=emulation, tuning=tuning)
            for emulation in (False, True)}
    return Demand(
        holder=vmi.id, uid=vmi.uid, namespace=vmi.metadata.namespace, labels=vmi.metadata.labels,
        node_selector=selector, required_terms=required, absent_labels=forbidden,
        host_model=model == CPU_MODEL_HOST_MODEL, avoid_obsolete_host_model=not model,
        preferred_terms=preferred, tolerations=tolerations,
        pod_affinity=tuple(pod_affinity.required_during_scheduling_ignored_during_execution
                           if pod_affinity else ()),
        pod_anti_affinity=tuple(anti.required_during_scheduling_ignored_during_execution
                                if anti else ()),
        preferred_pod_affinity=tuple(
            pod_affinity.preferred_during_scheduling_ignored_during_execution
            if pod_affinity else ()),
        preferred_pod_anti_affinity=tuple(
            anti.preferred_during_scheduling_ignored_during_execution if anti else ()),
        spread=tuple(spec.topology_spread_constraints),
        asks=asks, fit_checks={emulation: _fit_checks(ask) for emulation, ask in asks.items()})


def _fit_checks(ask: VMIResources) -> tuple[tuple[str, int], ...]:
    checks = ((RESOURCE_CPU, ask.cpu_millis), (RESOURCE_MEMORY, ask.memory_bytes),
              *sorted(ask.extended.items()))
    return tuple((resource, amount) for resource, amount in checks if amount)
