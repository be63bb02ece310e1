"""Events of Nodes. Heartbeats are not events; Ready / NotReady transitions are."""

from __future__ import annotations

from typing import Final

from events.api.node import NodeInfo
from events.codec import Event, event_type

NODE_KIND: Final = "node"


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
