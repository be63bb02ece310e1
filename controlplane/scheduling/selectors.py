"""Kubernetes' selector semantics, shared by the predicates and the priorities: node selector
terms (labels and the `metadata.name` field) and label selectors of pods."""

from __future__ import annotations

from events.api.scheduling import (
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    Taint,
    Toleration,
    selector_matches,
)

LABEL_NAMESPACE_NAME = "kubernetes.io/metadata.name"
"""The label every namespace carries with its own name: all a namespaceSelector can match
here, since virtbus keeps no Namespace objects."""


def _as_int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def requirement_holds(requirement: NodeSelectorRequirement, labels: dict[str, str]) -> bool:
    value = labels.get(requirement.key)
    match requirement.operator:
        case "In":
            return value is not None and value in requirement.values
        case "NotIn":
            return value is None or value not in requirement.values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
        case "Gt" | "Lt":
            if value is None or len(requirement.values) != 1:
                return False
            have, bound = _as_int(value), _as_int(requirement.values[0])
            if have is None or bound is None:
                return False
            return have > bound if requirement.operator == "Gt" else have < bound
    return False


def term_matches(term: NodeSelectorTerm, name: str, labels: dict[str, str]) -> bool:
    """A node selector term: every requirement holds; an empty term matches no node."""
    if not term.match_expressions and not term.match_fields:
        return False
    if not all(requirement_holds(r, labels) for r in term.match_expressions):
        return False
    return not term.match_fields or all(
        requirement_holds(r, {"metadata.name": name}) for r in term.match_fields)


def term_selects(term: PodAffinityTerm, own_namespace: str, namespace: str,
                 labels: dict[str, str]) -> bool:
    """Whether a pod (affinity) term, written in `own_namespace`, selects a pod in
    `namespace` with `labels`: its namespaces (or the namespace selector), else its own."""
    if term.namespaces or term.namespace_selector is not None:
        in_scope = namespace in term.namespaces or selector_matches(
            term.namespace_selector, {LABEL_NAMESPACE_NAME: namespace})
    else:
        in_scope = namespace == own_namespace
    return in_scope and selector_matches(term.label_selector, labels)


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """core/v1 `Toleration.ToleratesTaint`."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    return toleration.value == taint.value
