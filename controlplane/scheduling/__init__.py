"""Where a VMI may run and where it goes, decided as kube-scheduler decides it for the VMI's
launcher pod, with the node selectors and affinity KubeVirt renders for that pod.

Filters (`predicates`), in kube-scheduler's order; a node's first failure is what the
Unschedulable message counts for it:

| filter            | a node fails when                                  | reason            |
|-------------------|----------------------------------------------------|-------------------|
| NodeUnschedulable | cordoned, `node.kubernetes.io/unschedulable` not   | were unschedulable|
|                   | tolerated                                          |                   |
| TaintToleration   | a NoSchedule / NoExecute taint not tolerated (a    | had untolerated   |
|                   | NotReady node carries `not-ready` / `unreachable`) | taint {key: value}|
| NodeAffinity      | a nodeSelector label missing: the VMI's, HCO       | didn't match Pod's|
|                   | workloads', the CPU's (`cpu-model.node.kubevirt.io | node affinity/    |
|                   | /<model>`, `cpu-feature.node.kubevirt.io/<f>` for  | selector          |
|                   | require / force / no policy; `vmx` with evmcs); a  |                   |
|                   | `forbid` feature's                                 |                   |
|                   | label present; `host-model` without a host-model   |                   |
|                   | label; no model on an obsolete host CPU; a group   |                   |
|                   | of required terms (VMI's, workloads') unmet        |                   |
| NodeResourcesFit  | pods at capacity; cpu, memory, kvm / tun, hugepages| Too many pods;    |
|                   | short (VMIs placed earlier in the pass count)      | Insufficient <r>  |
| PodTopologySpread | a DoNotSchedule skew over maxSkew; no topology key | didn't match pod  |
|                   |                                                    | topology spread.. |
| InterPodAffinity  | a placed VMI's anti-affinity; the VMI's affinity   | didn't satisfy    |
|                   | or anti-affinity, by topology domain               | existing pods.. / |
|                   |                                                    | didn't match pod..|

(`messages` has each reason in full.)

No node fits: the VMI stays Pending with `PodScheduled` False, reason `Unschedulable`, and
`0/<nodes> nodes are available: <count> <reason>, ....` (reasons sorted as strings).

Scores (`priorities`), each normalized over the feasible nodes to 0..100, then weighted:

| plugin            | weight | prefers                                                    |
|-------------------|--------|------------------------------------------------------------|
| TaintToleration   | 3      | fewer untolerated PreferNoSchedule taints                  |
| NodeAffinity      | 2      | more weight of matched preferred terms (VMI's, workloads') |
| InterPodAffinity  | 2      | preferred pod affinity met, preferred anti-affinity not    |
| NodeResourcesFit  | 1      | more CPU and memory left free (LeastAllocated)             |
| tie-break         |        | lowest crc32(seed / VMI uid / node): seeded, no clock      |
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.scheduling.facts import Demand, NodeFacts, Usage
from controlplane.scheduling.ledger import Ledger
from controlplane.scheduling.messages import fit_error
from controlplane.scheduling.predicates import (
    FILTERS,
    FITS,
    NODE_ONLY_FILTERS,
    USAGE_FILTERS,
    Filter,
    PodContext,
    pod_context,
)
from controlplane.scheduling.priorities import best_node


@dataclass(frozen=True, slots=True)
class Placement:
    """A decision: the node, or why none fits (kube-scheduler's message)."""

    node: str | None
    message: str = ""


def decide(demand: Demand, ledger: Ledger, seed: int) -> Placement:
    """Filter every node, then score the feasible ones; the chosen node is counted in
    `ledger` at once, so the next decision sees it taken. What the node-only filters say
    is worked out once per kind of demand (`Ledger.node_verdicts`) while the nodes stay as they
    are."""
    pods = pod_context(demand, ledger)
    filters = USAGE_FILTERS if pods.empty else FILTERS[len(NODE_ONLY_FILTERS):]
    key = demand.node_key()
    verdicts = ledger.node_verdicts.get(key)
    if verdicts is None:
        verdicts = ledger.node_verdicts[key] = [
            _first_failure(NODE_ONLY_FILTERS, demand, node, ledger.usage[node.name], pods)
            for node in ledger.nodes]
    reasons: Counter[str] = Counter()
    feasible = []
    for node, verdict in zip(ledger.nodes, verdicts, strict=True):
        failed = verdict or _first_failure(filters, demand, node, ledger.usage[node.name],
                                           pods)
        if failed:
            reasons.update(failed)
        else:
            feasible.append(node)
    if not feasible:
        return Placement(None, fit_error(len(ledger.nodes), reasons))
    chosen = best_node(demand, feasible, ledger, seed).name
    ledger.place(chosen, demand)
    return Placement(chosen)


def _first_failure(filters: Sequence[Filter], demand: Demand, node: NodeFacts, usage: Usage,
                   pods: PodContext) -> Sequence[str]:
    """The reasons of the first filter `node` fails, or nothing."""
    for predicate in filters:
        failed = predicate(demand, node, usage, pods)
        if failed:
            return failed
    return FITS
