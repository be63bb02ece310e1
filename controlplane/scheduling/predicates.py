"""The filters, one per kube-scheduler plugin, in the order its default profile runs them.
Each returns the reasons the node does not fit (kube-scheduler's words), or nothing; a
node's first failing filter is the one its message counts.

`PodContext` holds what the pod-aware filters need about the whole cluster (domains with
matching pods, skew counts), worked out once per decision and only for a VMI that asks
for pod (anti-)affinity or spread, or when some placed VMI has anti-affinity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from controlplane.scheduling import messages
from controlplane.scheduling.facts import Demand, NodeFacts, Usage
from controlplane.scheduling.ledger import Ledger
from controlplane.scheduling.selectors import (
    term_matches,
    term_selects,
    tolerates,
)
from events.api.node import RESOURCE_PODS
from events.api.scheduling import PodAffinityTerm, TopologySpreadConstraint, selector_matches

FITS: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Spread:
    """One DoNotSchedule constraint: matching pods per domain of eligible nodes."""

    constraint: TopologySpreadConstraint
    counts: dict[str, int]
    minimum: int
    self_match: int


@dataclass(slots=True)
class PodContext:
    affinity: list[tuple[str, set[str] | None]] = field(default_factory=list)
    """Per required affinity term: its topology key and the domains with a matching pod;
    None where no pod matches but the VMI itself does (the first of a group goes anywhere)."""
    anti_affinity: list[tuple[str, set[str]]] = field(default_factory=list)
    existing_anti: set[tuple[str, str]] = field(default_factory=set)
    """(topology key, domain) pairs where a placed VMI's anti-affinity excludes this one."""
    spread: list[Spread] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Nothing pod-aware to check: the last two filters would pass every node."""
        return not (self.affinity or self.anti_affinity or self.existing_anti or self.spread)


Filter = Callable[[Demand, NodeFacts, Usage, PodContext], Sequence[str]]


def node_unschedulable(demand: Demand, node: NodeFacts, _usage: Usage,
                       _pods: PodContext) -> Sequence[str]:
    """NodeUnschedulable: a cordoned node, unless the unschedulable taint is tolerated."""
    if not node.unschedulable:
        return FITS
    cordon = next(t for t in node.taints if t.key == "node.kubernetes.io/unschedulable")
    if any(tolerates(t, cordon) for t in demand.tolerations):
        return FITS
    return (messages.NODE_UNSCHEDULABLE,)


def taint_toleration(demand: Demand, node: NodeFacts, _usage: Usage,
                     _pods: PodContext) -> Sequence[str]:
    """TaintToleration: the first NoSchedule / NoExecute taint no toleration tolerates."""
    for taint in node.taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(tolerates(t, taint) for t in demand.tolerations):
            return (messages.untolerated_taint(taint.key, taint.value),)
    return FITS


def node_affinity(demand: Demand, node: NodeFacts, _usage: Usage,
                  _pods: PodContext) -> Sequence[str]:
    """NodeAffinity: the nodeSelector (with KubeVirt's CPU model and feature labels), every
    required term group (the VMI's, the cluster placement's), the labels a CPU feature with
    policy `forbid` rules out, and the host-model labels."""
    labels = node.labels
    for key, value in demand.node_selector.items():
        if labels.get(key) != value:
            return (messages.NODE_AFFINITY,)
    fits = (not any(key in labels for key in demand.absent_labels)
            and (node.has_host_model or not demand.host_model)
            and not (demand.avoid_obsolete_host_model and node.obsolete_host_model)
            and all(any(term_matches(term, node.name, labels) for term in group)
                    for group in demand.required_terms))
    return FITS if fits else (messages.NODE_AFFINITY,)


def node_resources_fit(demand: Demand, node: NodeFacts, usage: Usage,
                       _pods: PodContext) -> Sequence[str]:
    """NodeResourcesFit: room for one more pod (when the node reports a pod capacity), then
    CPU, memory and each extended resource (devices, hugepages) asked for."""
    have, used = node.allocatable, usage.amounts
    short = [messages.insufficient(resource)
             for resource, amount in demand.fit_checks[node.emulation]
             if used.get(resource, 0) + amount > have.get(resource, 0)]
    pods = have.get(RESOURCE_PODS)
    if pods is not None and usage.pod_count() + 1 > pods:
        return [messages.TOO_MANY_PODS, *short]
    return short


def pod_topology_spread(_demand: Demand, node: NodeFacts, _usage: Usage,
                        pods: PodContext) -> Sequence[str]:
    """PodTopologySpread: placing the VMI here keeps each DoNotSchedule skew in bounds."""
    for spread in pods.spread:
        domain = node.labels.get(spread.constraint.topology_key)
        if domain is None:
            return (messages.TOPOLOGY_SPREAD_MISSING_LABEL,)
        skew = spread.counts.get(domain, 0) + spread.self_match - spread.minimum
        if skew > spread.constraint.max_skew:
            return (messages.TOPOLOGY_SPREAD,)
    return FITS


def inter_pod_affinity(_demand: Demand, node: NodeFacts, _usage: Usage,
                       pods: PodContext) -> Sequence[str]:
    """InterPodAffinity: placed VMIs' anti-affinity, then the VMI's affinity and its
    anti-affinity, each by topology domain."""
    labels = node.labels
    if any(labels.get(key) == value for key, value in pods.existing_anti):
        return (messages.EXISTING_ANTI_AFFINITY,)
    for key, affine in pods.affinity:
        if affine is not None and labels.get(key) not in affine:
            return (messages.POD_AFFINITY,)
    for key, domains in pods.anti_affinity:
        if labels.get(key) in domains:
            return (messages.POD_ANTI_AFFINITY,)
    return FITS


FILTERS: tuple[Filter, ...] = (node_unschedulable, taint_toleration, node_affinity,
                               node_resources_fit, pod_topology_spread, inter_pod_affinity)
"""kube-scheduler's default filter order (of the plugins that apply to a VMI's pod)."""
NODE_ONLY_FILTERS: tuple[Filter, ...] = FILTERS[:3]
"""The filters that read nothing but the node and the VMI's node demands."""
USAGE_FILTERS: tuple[Filter, ...] = FILTERS[3:4]
"""What is left to check when `PodContext.empty`: what the node holds."""

def pod_context(demand: Demand, ledger: Ledger) -> PodContext:
    """What the pod-aware filters need for this decision, from every placed VMI."""
    context = PodContext()
    if not (demand.pod_affinity or demand.pod_anti_affinity or demand.spread
            or ledger.anti_affinity_placed):
        return context
    placed = [(ledger.facts[name], pod) for name, usage in ledger.usage.items()
              for pod in usage.pods.values()]
    for facts, pod in placed:
        for term in pod.anti_affinity:
            domain = facts.labels.get(term.topology_key)
            if domain is not None and term_selects(term, pod.namespace, demand.namespace,
                                                   demand.labels):
                context.existing_anti.add((term.topology_key, domain))
    def domains(term: PodAffinityTerm) -> set[str]:
        return {facts.labels[term.topology_key] for facts, pod in placed
                if term.topology_key in facts.labels
                and term_selects(term, demand.namespace, pod.namespace, pod.labels)}

    for term in demand.pod_affinity:
        affine = domains(term)
        first = not affine and term_selects(term, demand.namespace, demand.namespace,
                                            demand.labels)
        context.affinity.append((term.topology_key, None if first else affine))
    context.anti_affinity = [(term.topology_key, domains(term))
                             for term in demand.pod_anti_affinity]
    eligible = [f for f in ledger.nodes
                if not node_affinity(demand, f, ledger.usage[f.name], context)]
    for constraint in demand.spread:
        if constraint.when_unsatisfiable != "DoNotSchedule":
            continue
        key = constraint.topology_key
        counts = {f.labels[key]: 0 for f in eligible if key in f.labels}
        for facts, pod in placed:
            domain = facts.labels.get(key)
            if (domain in counts and pod.namespace == demand.namespace
                    and selector_matches(constraint.label_selector, pod.labels)):
                counts[domain] += 1
        minimum = min(counts.values(), default=0)
        if constraint.min_domains is not None and len(counts) < constraint.min_domains:
            minimum = 0
        self_match = int(selector_matches(constraint.label_selector, demand.labels))
        context.spread.append(Spread(constraint, counts, minimum, self_match))
    return context
