"""Zone disruption: which NotReady nodes' VMIs may be failed now, as kube's node lifecycle
controller decides which lost nodes it taints for eviction.

A lost node's VMIs are failed (kube: its pods evicted) one node at a time, at a rate set per
zone (`topology.kubernetes.io/region` and `/zone`; nodes without them form one zone) by the
zone's state, computed on every round from the nodes' readiness in the log:

| the zone's nodes                    | state             | lost nodes let go              |
|-------------------------------------|-------------------|--------------------------------|
| none Ready (some NotReady)          | FullDisruption    | 0.1/s; none if every zone is   |
| more than 2 NotReady, ≥ 55 % of all | PartialDisruption | 0.01/s if > 50 nodes; else none |
| otherwise                           | Normal            | 0.1/s                          |

Every zone fully disrupted is kube's "master disruption mode": when every node falls silent
at once, the fault is more likely the control plane's own (its network, a NATS that lost
them) or a whole fleet restarting than every host at once, so nothing is failed; nodes let
go before are taken back. Leaving it, every node gets its grace again (`NodeLifecycle`) and
the rates start drained, so the nodes coming back have time to beat before any is judged.

A node is let go by its zone's token bucket (burst 1: the first at once, then one per
1/rate seconds), in the order the nodes went NotReady; its VMIs are failed once it has been
let go for `LOST_NODE_TOLERATION_SECONDS` (the pods' toleration of the NoExecute taint) and
is still NotReady. A node Ready again leaves the queue. The queues live in memory: a control
plane that starts lets its lost nodes go anew.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

import structlog

from controlplane.defaults import (
    EVICTION_RATE_NODES_PER_SECOND,
    LARGE_CLUSTER_SIZE_THRESHOLD,
    LOST_NODE_TOLERATION_SECONDS,
    SECONDARY_EVICTION_RATE_NODES_PER_SECOND,
    UNHEALTHY_ZONE_THRESHOLD,
)
from events.api.scheduling import (
    LABEL_FAILURE_DOMAIN_REGION,
    LABEL_FAILURE_DOMAIN_ZONE,
    LABEL_TOPOLOGY_REGION,
    LABEL_TOPOLOGY_ZONE,
)
from projections.kinds.vm import NodeView

log = structlog.get_logger(__name__)


class ZoneState(StrEnum):
    NORMAL = "Normal"
    PARTIAL_DISRUPTION = "PartialDisruption"
    FULL_DISRUPTION = "FullDisruption"


def zone_of(labels: dict[str, str]) -> str:
    """The node's zone, region first (kube's `GetZoneKey`, readably); "" without either."""
    region = labels.get(LABEL_TOPOLOGY_REGION) or labels.get(LABEL_FAILURE_DOMAIN_REGION, "")
    zone = labels.get(LABEL_TOPOLOGY_ZONE) or labels.get(LABEL_FAILURE_DOMAIN_ZONE, "")
    return f"{region}/{zone}" if region or zone else ""


def zone_state(ready: int, not_ready: int) -> ZoneState:
    """kube's `ComputeZoneState`."""
    if ready == 0 and not_ready > 0:
        return ZoneState.FULL_DISRUPTION
    if not_ready > 2 and not_ready / (ready + not_ready) >= UNHEALTHY_ZONE_THRESHOLD:
        return ZoneState.PARTIAL_DISRUPTION
    return ZoneState.NORMAL


def eviction_rate(state: ZoneState, size: int) -> float:
    """Lost nodes let go per second in a zone of `size` nodes in `state`, some zone being
    not fully disrupted (kube's `setLimiterInZone`)."""
    if state is ZoneState.PARTIAL_DISRUPTION:
        return (SECONDARY_EVICTION_RATE_NODES_PER_SECOND if size > LARGE_CLUSTER_SIZE_THRESHOLD
                else 0.0)
    return EVICTION_RATE_NODES_PER_SECOND


@dataclass(slots=True)
class TokenBucket:
    """A rate with a burst of one, full at first; a rate of 0 never lets anything go."""

    rate: float
    tokens: float = 1.0
    at: float = -math.inf

    def take(self, now: float) -> bool:
        if self.rate <= 0:
            return False
        self.tokens = min(1.0, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def swapped(self, rate: float, now: float) -> TokenBucket:
        """A bucket at `rate` instead: drained if this one has nothing to give now, so a
        change of rate never lets a node go sooner (kube's `SwapLimiter`)."""
        if rate == self.rate:
            return self
        fresh = TokenBucket(rate)
        if not self.take(now):
            fresh.take(now)
        return fresh


@dataclass(slots=True)
class _Zone:
    state: ZoneState | None = None
    bucket: TokenBucket = field(
        default_factory=lambda: TokenBucket(EVICTION_RATE_NODES_PER_SECOND))
    queue: list[str] = field(default_factory=list)
    """NotReady nodes waiting to be let go, in the order they went NotReady."""


@dataclass(slots=True)
class Evictions:
    """The zones' states and queues, and the nodes let go (when each was)."""

    zones: dict[str, _Zone] = field(default_factory=dict)
    let_go: dict[str, float] = field(default_factory=dict)
    every_zone_disrupted: bool = False

    def observe(self, nodes: Iterable[NodeView], now: float) -> bool:
        """Take in the nodes' readiness at `now` and let go what the zones' rates allow;
        whether this round leaves master disruption mode (every node then gets its grace
        again)."""
        by_zone: dict[str, list[NodeView]] = {}
        for node in nodes:
            by_zone.setdefault(zone_of(node.all_labels), []).append(node)
        states = {zone: zone_state(sum(n.ready for n in members),
                                   sum(not n.ready for n in members))
                  for zone, members in by_zone.items()}
        for gone in self.zones.keys() - states.keys():
            del self.zones[gone]
        names = {n.name for members in by_zone.values() for n in members}
        for gone in self.let_go.keys() - names:
            del self.let_go[gone]
        was = self.every_zone_disrupted
        self.every_zone_disrupted = bool(states) and all(
            s is ZoneState.FULL_DISRUPTION for s in states.values())
        if self.every_zone_disrupted:
            if not was:
                log.warning("every node NotReady: no VMI is failed until a node is Ready "
                            "again (master disruption mode)", nodes=len(self.let_go))
                for zone in self.zones.values():
                    zone.queue.clear()
                    zone.bucket = zone.bucket.swapped(0.0, now)
                self.let_go.clear()
            return False
        if was:
            log.info("a node is Ready again: leaving master disruption mode")
        for name, members in by_zone.items():
            self._observe_zone(name, members, states[name], now)
        return was

    def _observe_zone(self, name: str, members: list[NodeView], state: ZoneState,
                      now: float) -> None:
        names = {n.name for n in members}
        zone = self.zones.setdefault(name, _Zone())
        if zone.state is not state:
            if zone.state is not None:
                log.warning("zone state changed", zone=name, state=state.value,
                            not_ready=sum(not n.ready for n in members), nodes=len(members))
            zone.state = state
        zone.bucket = zone.bucket.swapped(eviction_rate(state, len(members)), now)
        zone.queue = [n for n in zone.queue if n in names]
        for node in members:
            if node.ready:
                self.let_go.pop(node.name, None)
                if node.name in zone.queue:
                    zone.queue.remove(node.name)
            elif node.name not in self.let_go and node.name not in zone.queue:
                zone.queue.append(node.name)
        while zone.queue and zone.bucket.take(now):
            node_name = zone.queue.pop(0)
            self.let_go[node_name] = now
            log.warning("lost node let go: its VMIs fail once their toleration is over",
                        node=node_name, zone=name, zone_state=state.value,
                        toleration_s=LOST_NODE_TOLERATION_SECONDS)

    def due(self, node: str, now: float) -> bool:
        """Whether `node`'s VMIs are failed now: let go, and their toleration over."""
        since = self.let_go.get(node)
        return since is not None and now - since >= LOST_NODE_TOLERATION_SECONDS
