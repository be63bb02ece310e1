"""Node commands: from report intake and the node lifecycle controller (register, ready,
not-ready), and from operators, as kubectl spells them (label, taint, cordon, uncordon).

What an operator sets is its own fact on the node (`NodeLabelsChanged`, `NodeTaintsChanged`,
`NodeCordoned`): an agent registering again replaces only what it reported.
"""

from __future__ import annotations

import msgspec

from controlplane.aggregate import Aggregate
from controlplane.decision import Decision, Rejected, handles
from events.api.errors import InvalidSpec
from events.api.node import LabelBody, NodeInfo, TaintBody
from events.api.scheduling import label_key_problem, label_value_problem
from events.language.kinds.nodes import (
    NODE_KIND,
    NodeCordoned,
    NodeInfoChanged,
    NodeLabelsChanged,
    NodeNotReady,
    NodeReady,
    NodeRegistered,
    NodeTaintsChanged,
    NodeUncordoned,
)
from events.language.subjects import aggregate_id
from projections.kinds.vm import NodeView

KIND = "Node"


class NotReadyBody(msgspec.Struct, frozen=True, kw_only=True):
    """The node lifecycle controller's `not-ready`: why."""

    reason: str = "NodeStatusUnknown"


def load_node(d: Decision) -> Aggregate[NodeView]:
    return d.load(aggregate_id(NODE_KIND, "", d.command.name), NodeView)


@handles(KIND, "register", internal=True)
def register(d: Decision) -> None:
    """An agent's host description: registers the node, or records what changed."""
    info = d.body(NodeInfo)
    node = load_node(d)
    if not node.exists:
        d.trigger(node, NodeRegistered, info=info)
    elif node.state.info != info:
        d.trigger(node, NodeInfoChanged, info=info)
    if not node.state.ready:
        d.trigger(node, NodeReady)


@handles(KIND, "ready", internal=True)
def ready(d: Decision) -> None:
    node = load_node(d)
    if not node.exists or node.state.ready:
        raise Rejected("unknown or already Ready")
    d.trigger(node, NodeReady)


@handles(KIND, "not-ready", internal=True)
def not_ready(d: Decision) -> None:
    node = load_node(d)
    if not node.exists or not node.state.ready:
        raise Rejected("unknown or already NotReady")
    reason = d.body(NotReadyBody).reason
    d.trigger(node, NodeNotReady, reason=reason)


def existing_node(d: Decision) -> Aggregate[NodeView]:
    node = load_node(d)
    if not node.exists:
        raise Rejected(f'nodes "{d.command.name}" not found', "metadata.name")
    return node


def _check_label(key: str, value: str = "") -> None:
    problem = label_key_problem(key)
    if problem is None:
        problem = label_value_problem(value)
    if problem is not None:
        raise InvalidSpec(key, problem)


@handles(KIND, "label")
def label(d: Decision) -> None:
    """kubectl label: the operator's labels change; the agent's discovery labels stay its own
    (removing one of those removes nothing: the agent would report it again)."""
    body = d.body(LabelBody)
    node = existing_node(d)
    shown = node.state.all_labels
    labels = dict(node.state.labels)
    for key, value in body.labels.items():
        _check_label(key, value)
        if key in shown and shown[key] != value and not body.overwrite:
            raise Rejected(f"'{key}' already has a value ({shown[key]}), and --overwrite is "
                           "false")
        labels[key] = value
    for key in body.remove:
        labels.pop(key, None)
    if labels != node.state.labels:
        d.trigger(node, NodeLabelsChanged, labels=labels)


@handles(KIND, "taint")
def taint(d: Decision) -> None:
    """kubectl taint: add (one per key and effect), replace with `overwrite`, remove."""
    body = d.body(TaintBody)
    node = existing_node(d)
    taints = list(node.state.taints)
    for gone in body.remove:
        kept = [t for t in taints
                if not (t.key == gone.key and gone.effect in (None, t.effect))]
        if len(kept) == len(taints):
            shown = gone.key + (f":{gone.effect}" if gone.effect else "")
            raise Rejected(f'taint "{shown}" not found')
        taints = kept
    for new in body.add:
        _check_label(new.key, new.value)
        same = [t for t in taints if (t.key, t.effect) == (new.key, new.effect)]
        if same and not body.overwrite:
            raise Rejected(f"node {d.command.name} already has {new.key} taint(s) with same "
                           "effect(s) and --overwrite is false")
        taints = [t for t in taints if t not in same] + [new]
    if taints != node.state.taints:
        d.trigger(node, NodeTaintsChanged, taints=taints)


@handles(KIND, "cordon")
def cordon(d: Decision) -> None:
    """kubectl cordon: accepted with no event when the node is cordoned already."""
    node = existing_node(d)
    if not node.state.unschedulable:
        d.trigger(node, NodeCordoned)


@handles(KIND, "uncordon")
def uncordon(d: Decision) -> None:
    node = existing_node(d)
    if node.state.unschedulable:
        d.trigger(node, NodeUncordoned)
