"""kube-scheduler's words for why a node does not fit, and its FitError message.

Each reason is a plugin's own string (pkg/scheduler/framework/plugins/...), and the message
is `FitError.Error()`: `0/<nodes> nodes are available: ` then the histogram of reasons,
each `<count> <reason>`, sorted as strings, joined by `, `, and a full stop.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

NODE_UNSCHEDULABLE: Final = "node(s) were unschedulable"
"""NodeUnschedulable: a cordoned node (spec.unschedulable)."""
UNTOLERATED_TAINT: Final = "node(s) had untolerated taint {{{key}: {value}}}"
"""TaintToleration: the first NoSchedule / NoExecute taint the pod does not tolerate."""
NODE_AFFINITY: Final = "node(s) didn't match Pod's node affinity/selector"
"""NodeAffinity: nodeSelector or required node affinity (KubeVirt's CPU model and feature
labels are both)."""
INSUFFICIENT: Final = "Insufficient {resource}"
TOO_MANY_PODS: Final = "Too many pods"
"""NodeResourcesFit: one reason per resource short, pods first, then cpu, memory, and the
extended resources."""
TOPOLOGY_SPREAD: Final = "node(s) didn't match pod topology spread constraints"
TOPOLOGY_SPREAD_MISSING_LABEL: Final = TOPOLOGY_SPREAD + " (missing required label)"
POD_AFFINITY: Final = "node(s) didn't match pod affinity rules"
POD_ANTI_AFFINITY: Final = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY: Final = "node(s) didn't satisfy existing pods anti-affinity rules"
"""PodTopologySpread and InterPodAffinity."""
NO_NODES: Final = "no nodes available to schedule pods"
"""ErrNoNodesAvailable: there is no node at all."""


def untolerated_taint(key: str, value: str) -> str:
    return UNTOLERATED_TAINT.format(key=key, value=value)


def insufficient(resource: str) -> str:
    return INSUFFICIENT.format(resource=resource)


def fit_error(nodes: int, reasons: Counter[str]) -> str:
    """kube-scheduler's message for a pod no node fits."""
    if nodes == 0:
        return NO_NODES
    histogram = sorted(f"{count} {reason}" for reason, count in reasons.items())
    return f"0/{nodes} nodes are available: {', '.join(histogram)}."
