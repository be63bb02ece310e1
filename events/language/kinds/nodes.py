"""Events of Nodes. Heartbeats are not events; Ready / NotReady transitions are.

What the agent reports (`NodeInfo`, with its discovery labels) and what an operator sets
(labels, taints, cordon) are separate facts: a node registering again replaces the first,
never the second.
"""

from __future__ import annotations

from typing import Final

from events.api.node import NODE, NodeInfo
from events.api.scheduling import Taint
from events.language.codec import Event, event_type

NODE_KIND: Final = NODE.token


@event_type("NodeRegistered")
class NodeRegistered(Event, frozen=True, kw_only=True):
    info: NodeInfo


@event_type("NodeInfoChanged")
class NodeInfoChanged(Event, frozen=True, kw_only=True):
    info: NodeInfo


@event_type("NodeReady")
class NodeReady(Event, frozen=True, kw_only=True):
    pass


@event_type("NodeNotReady")
class NodeNotReady(Event, frozen=True, kw_only=True):
    reason: str


@event_type("NodeLabelsChanged")
class NodeLabelsChanged(Event, frozen=True, kw_only=True):
    """`label node`: the labels the operator has set on the node, all of them, after it."""

    labels: dict[str, str]


@event_type("NodeTaintsChanged")
class NodeTaintsChanged(Event, frozen=True, kw_only=True):
    """`taint node`: the node's taints, all of them, after it."""

    taints: list[Taint]


@event_type("NodeCordoned")
class NodeCordoned(Event, frozen=True, kw_only=True):
    """`cordon`: no new VMI is placed on the node (spec.unschedulable)."""


@event_type("NodeUncordoned")
class NodeUncordoned(Event, frozen=True, kw_only=True):
    pass


@event_type("NodeDrainRequested")
class NodeDrainRequested(Event, frozen=True, kw_only=True):
    """`drain`: the node is cordoned and every VMI on it evicted by its eviction strategy;
    the drain's correlation id is on every migration and eviction it causes."""


@event_type("NodeDrained")
class NodeDrained(Event, frozen=True, kw_only=True):
    """The drain is over: the node holds nothing it can evict."""
