"""The scores, one per kube-scheduler scoring plugin, each normalized over the feasible
nodes to 0..`MAX_NODE_SCORE` as its plugin does, then weighted and summed; the best total
wins, and a seeded hash of (seed, VMI uid, node) breaks ties, where kube-scheduler picks at
random: deterministic, and not always the same node for every VMI."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

from controlplane.defaults import (
    MAX_NODE_SCORE,
    SCORE_WEIGHT_INTER_POD_AFFINITY,
    SCORE_WEIGHT_NODE_AFFINITY,
    SCORE_WEIGHT_NODE_RESOURCES_FIT,
    SCORE_WEIGHT_TAINT_TOLERATION,
)
from controlplane.scheduling.facts import Demand, NodeFacts
from controlplane.scheduling.ledger import Ledger
from controlplane.scheduling.selectors import term_matches, term_selects, tolerates
from events.api.node import RESOURCE_CPU, RESOURCE_MEMORY

Score = Callable[[Demand, NodeFacts, Ledger], int]


def node_affinity_score(demand: Demand, node: NodeFacts, _ledger: Ledger) -> int:
    """NodeAffinity: the weights of the preferred terms the node matches."""
    return sum(p.weight for p in demand.preferred_terms
               if term_matches(p.preference, node.name, node.labels))


def intolerable_prefer_no_schedule(demand: Demand, node: NodeFacts, _ledger: Ledger) -> int:
    """TaintToleration: how many PreferNoSchedule taints the VMI does not tolerate (fewer is
    better: normalized in reverse)."""
    if not node.taints:
        return 0
    return sum(1 for taint in node.taints if taint.effect == "PreferNoSchedule"
               and not any(tolerates(t, taint) for t in demand.tolerations))


def least_allocated(demand: Demand, node: NodeFacts, ledger: Ledger) -> int:
    """NodeResourcesFit (LeastAllocated): the share of CPU and memory left free once the
    VMI is placed, averaged."""
    ask = demand.asks[node.emulation]
    used = ledger.usage[node.name].amounts
    total = 0
    for resource, amount in ((RESOURCE_CPU, ask.cpu_millis), (RESOURCE_MEMORY, ask.memory_bytes)):
        have = node.allocatable.get(resource, 0)
        if have:
            total += (have - used.get(resource, 0) - amount) * MAX_NODE_SCORE // have
    return total // 2


def inter_pod_affinity_score(demand: Demand, node: NodeFacts, ledger: Ledger) -> int:
    """InterPodAffinity: per placed VMI in the node's domain of a preferred term, + the
    weight of a matching affinity term, - that of a matching anti-affinity term."""
    score = 0
    for sign, terms in ((1, demand.preferred_pod_affinity),
                        (-1, demand.preferred_pod_anti_affinity)):
        for weighted in terms:
            term = weighted.pod_affinity_term
            domain = node.labels.get(term.topology_key)
            if domain is None:
                continue
            for name, usage in ledger.usage.items():
                if ledger.facts[name].labels.get(term.topology_key) != domain:
                    continue
                score += sign * weighted.weight * sum(
                    1 for pod in usage.pods.values()
                    if term_selects(term, demand.namespace, pod.namespace, pod.labels))
    return score


def _normalized(raw: Sequence[int], *, reverse: bool = False) -> list[int]:
    """framework.DefaultNormalizeScore: scale to 0..MAX by the highest (reversed: fewer is
    better); scores that may go negative (pod affinity) are shifted by the lowest first."""
    low = min(raw, default=0)
    shifted = [r - low for r in raw] if low < 0 else list(raw)
    high = max(shifted, default=0)
    if high == 0:
        return [MAX_NODE_SCORE if reverse else 0 for _ in shifted]
    scaled = [s * MAX_NODE_SCORE // high for s in shifted]
    return [MAX_NODE_SCORE - s for s in scaled] if reverse else scaled


def _always(_demand: Demand) -> bool:
    return True


SCORES: tuple[tuple[Score, int, bool, Callable[[Demand], bool]], ...] = (
    (intolerable_prefer_no_schedule, SCORE_WEIGHT_TAINT_TOLERATION, True, _always),
    (node_affinity_score, SCORE_WEIGHT_NODE_AFFINITY, False,
     lambda demand: bool(demand.preferred_terms)),
    (inter_pod_affinity_score, SCORE_WEIGHT_INTER_POD_AFFINITY, False,
     lambda demand: bool(demand.preferred_pod_affinity or demand.preferred_pod_anti_affinity)),
    (least_allocated, SCORE_WEIGHT_NODE_RESOURCES_FIT, False, _always),
)
"""Each plugin's raw score, its weight, whether fewer is better, and whether it can tell
nodes apart for this VMI at all (else it is not computed)."""


def tie_break(seed: int, uid: str, node: str) -> int:
    """Lower wins among equal totals: a fixed function of the seed, the VMI and the node."""
    return zlib.crc32(f"{seed}/{uid}/{node}".encode())


def best_node(demand: Demand, feasible: Sequence[NodeFacts], ledger: Ledger,
              seed: int) -> NodeFacts:
    """The feasible node with the highest weighted total, ties broken by `tie_break`."""
    totals = [0] * len(feasible)
    for score, weight, reverse, applies in SCORES:
        if not applies(demand):
            continue
        raw = [score(demand, node, ledger) for node in feasible]
        if len(set(raw)) <= 1:
            continue  # the same for every node: it decides nothing
        for i, value in enumerate(_normalized(raw, reverse=reverse)):
            totals[i] += weight * value
    top = max(totals)
    best = [node for node, total in zip(feasible, totals, strict=True) if total == top]
    return min(best, key=lambda node: tie_break(seed, demand.uid, node.name))
