"""Node commands, issued by report intake and the node lifecycle controller."""

from __future__ import annotations

import msgspec

from controlplane.aggregate import Aggregate
from controlplane.handling import Decision, Rejected, handles
from events.api.node import NodeInfo
from events.nodes import NODE_KIND, NodeInfoChanged, NodeNotReady, NodeReady, NodeRegistered
from events.subjects import aggregate_id
from projections.views import NodeView

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
