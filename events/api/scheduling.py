"""Kubernetes' scheduling vocabulary as VMIs, nodes and the HyperConverged carry it: taints,
tolerations, node selector terms and (anti-)affinity, as core/v1 spells them.

Pod (anti-)affinity is typed here too, so a manifest with a typo is refused at admission;
the scheduler reads all of it (see `controlplane.scheduling`).
"""

from __future__ import annotations

import re
from typing import Final, Literal

from events.api.base import ApiStruct
from events.api.names import DNS1123_SUBDOMAIN, DNS1123_SUBDOMAIN_MAX

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
TAINT_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")

TAINT_NOT_READY: Final = "node.kubernetes.io/not-ready"
TAINT_UNREACHABLE: Final = "node.kubernetes.io/unreachable"
TAINT_UNSCHEDULABLE: Final = "node.kubernetes.io/unschedulable"
"""The taints Kubernetes' node lifecycle controller puts on a node for its conditions
(TaintNodesByCondition): a NotReady, an unreachable (status unknown) and a cordoned node."""

LABEL_HOSTNAME: Final = "kubernetes.io/hostname"
LABEL_ARCH: Final = "kubernetes.io/arch"
LABEL_OS: Final = "kubernetes.io/os"
"""Labels the kubelet sets on every node: what topology keys and selectors usually name."""
LABEL_TOPOLOGY_ZONE: Final = "topology.kubernetes.io/zone"
LABEL_TOPOLOGY_REGION: Final = "topology.kubernetes.io/region"
LABEL_FAILURE_DOMAIN_ZONE: Final = "failure-domain.beta.kubernetes.io/zone"
LABEL_FAILURE_DOMAIN_REGION: Final = "failure-domain.beta.kubernetes.io/region"
"""A node's zone and region (the stable labels, else the deprecated beta ones): the node
lifecycle controller judges disruption per zone."""


class Taint(ApiStruct):
    key: str
    effect: TaintEffect
    value: str = ""


class Toleration(ApiStruct):
    """Tolerates taints of `key` (every key when empty, with `Exists`) and `effect` (every
    effect when empty); `Equal` (the default) also needs the value."""

    key: str = ""
    operator: Literal["", "Equal", "Exists"] = ""
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    toleration_seconds: int | None = None


SelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]


class NodeSelectorRequirement(ApiStruct):
    key: str
    operator: SelectorOperator
    values: list[str] = []


class NodeSelectorTerm(ApiStruct):
    """Requirements that all hold; an empty term matches no node."""

    match_expressions: list[NodeSelectorRequirement] = []
    match_fields: list[NodeSelectorRequirement] = []


class NodeSelector(ApiStruct):
    """Terms of which one must hold."""

    node_selector_terms: list[NodeSelectorTerm]


class PreferredSchedulingTerm(ApiStruct):
    weight: int
    preference: NodeSelectorTerm


class NodeAffinity(ApiStruct):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = []


class LabelSelectorRequirement(ApiStruct):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = []


class LabelSelector(ApiStruct):
    """metav1.LabelSelector; an empty selector matches everything, `None` matches nothing."""

    match_labels: dict[str, str] = {}
    match_expressions: list[LabelSelectorRequirement] = []


class PodAffinityTerm(ApiStruct):
    topology_key: str
    label_selector: LabelSelector | None = None
    namespaces: list[str] = []
    namespace_selector: LabelSelector | None = None


class WeightedPodAffinityTerm(ApiStruct):
    weight: int
    pod_affinity_term: PodAffinityTerm


class PodAffinity(ApiStruct):
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = []
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = []


class Affinity(ApiStruct):
    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class TopologySpreadConstraint(ApiStruct):
    max_skew: int
    topology_key: str
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    label_selector: LabelSelector | None = None
    min_domains: int | None = None
    match_label_keys: list[str] = []


_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
LABEL_NAME_RULE: Final = ("must be 63 characters or less, consist of alphanumeric characters, "
                          "'-', '_' or '.', and start and end with an alphanumeric character")


def label_key_problem(key: str) -> str | None:
    """What is wrong with a label (or taint) key as Kubernetes validates it, or None."""
    prefix, _, name = key.rpartition("/")
    bad_prefix = (not prefix or len(prefix) > DNS1123_SUBDOMAIN_MAX
                  or not DNS1123_SUBDOMAIN.fullmatch(prefix))
    if "/" in key and bad_prefix:
        return "prefix part must be a lowercase RFC 1123 subdomain of at most 253 characters"
    if len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        return f"name part {LABEL_NAME_RULE}"
    return None


def label_value_problem(value: str) -> str | None:
    """What is wrong with a label (or taint) value, or None; empty is a value."""
    if value and (len(value) > 63 or not _LABEL_NAME.fullmatch(value)):
        return f"a valid label value {LABEL_NAME_RULE}"
    return None


def selector_matches(selector: LabelSelector | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector: `None` matches nothing, an empty selector everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in selector.match_labels.items()):
        return False
    for expression in selector.match_expressions:
        value = labels.get(expression.key)
        match expression.operator:
            case "In":
                ok = value is not None and value in expression.values
            case "NotIn":
                ok = value is None or value not in expression.values
            case "Exists":
                ok = value is not None
            case "DoesNotExist":
                ok = value is None
        if not ok:
            return False
    return True
