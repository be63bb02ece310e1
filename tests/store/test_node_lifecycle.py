"""The node lifecycle controller's decisions on the real store: a lost node's VMIs are failed
once the log shows the node NotReady and its zone let it go, after their toleration, asked
for on every round until they are (level-triggered), each by one command however often it is
decided; a VMI whose deletion waited for that node is deleted with it. Zones: none failed
while every node is NotReady (and every node a grace again after), none in a small zone
mostly lost, one node at a time at kube's rates otherwise."""

from __future__ import annotations

import math
import uuid

from controlplane.defaults import (
    EVICTION_RATE_NODES_PER_SECOND,
    LARGE_CLUSTER_SIZE_THRESHOLD,
    LOST_NODE_TOLERATION_SECONDS,
    NODE_MONITOR_GRACE_SECONDS,
    SECONDARY_EVICTION_RATE_NODES_PER_SECOND,
)
from controlplane.node.controller import NodeLifecycle
from events.api.scheduling import LABEL_HOSTNAME, LABEL_TOPOLOGY_ZONE
from events.language.kinds.vm import NODE_UNRESPONSIVE
from events.language.messages import Command
from tests.store.helpers import SyncHandler
from tests.store.scheduling_helpers import Cluster

NOW = 0.0
"""The instant rounds judge at: any, since the controller never heard from the lost nodes."""
DUE = NOW + LOST_NODE_TOLERATION_SECONDS
"""When the VMIs of a node let go at `NOW` are failed."""
PRIMARY_INTERVAL = 1 / EVICTION_RATE_NODES_PER_SECOND
SECONDARY_INTERVAL = 1 / SECONDARY_EVICTION_RATE_NODES_PER_SECOND


def cluster(handler: SyncHandler, nodes: list[str], pinned: dict[str, str]) -> Cluster:
    """`nodes` registered, and a VMI on each node `pinned` names (VMI name -> node)."""
    c = Cluster(handler)
    for name in nodes:
        c.node(name)
    for vmi, node in pinned.items():
        c.vmi(vmi, {"nodeSelector": {LABEL_HOSTNAME: node}})
    c.schedule()
    assert {vmi: c.node_of(vmi) for vmi in pinned} == pinned
    return c


def lifecycle_hearing(handler: SyncHandler, alive: list[str], at: float = NOW) -> NodeLifecycle:
    """A lifecycle controller that heard `alive` beat `at`, and never any other node."""
    lifecycle = NodeLifecycle(handler.bridge.nc, handler.handler.log.layout)
    lifecycle.started = -math.inf
    lifecycle.last_seen = dict.fromkeys(alive, at)
    return lifecycle


def lost(c: Cluster, lifecycle: NodeLifecycle, now: float = NOW) -> list[str]:
    """The NotReady transitions due at `now`, executed; the nodes they are for."""
    transitions = lifecycle.transitions(c.state, now)
    for command in transitions:
        c.run(command)
    return sorted(command.name for command in transitions if command.verb == "not-ready")


def failed_nodes(c: Cluster, lifecycle: NodeLifecycle, now: float) -> set[str]:
    """The nodes whose VMIs a round at `now` fails."""
    return {c.node_of(f.name) for f in lifecycle.failures(c.state, now)}


def lost_node_with_a_vmi(handler: SyncHandler) -> tuple[Cluster, NodeLifecycle]:
    """Node `n1` running VMI `v`, `n2` beating, and a controller that never heard `n1`."""
    c = cluster(handler, ["n1", "n2"], {"v": "n1"})
    return c, lifecycle_hearing(handler, ["n2"])


def test_a_lost_nodes_vmis_are_failed_every_round_until_they_are(
        handler: SyncHandler) -> None:
    c, lifecycle = lost_node_with_a_vmi(handler)
    assert lifecycle.failures(c.state, DUE) == [], "not while the node is Ready in the log"
    assert lost(c, lifecycle) == ["n1"]
    assert lifecycle.transitions(c.state, NOW) == []

    assert lifecycle.failures(c.state, NOW) == [], "let go now: the toleration runs"
    assert lifecycle.failures(c.state, DUE - 0.1) == []
    [fail] = lifecycle.failures(c.state, DUE)
    [again] = lifecycle.failures(c.state, DUE)  # a round later, or a control plane restarted
    assert (fail.verb, again.id) == ("fail", fail.id)
    first = c.run(fail).outcome
    assert handler.execute(again).outcome == first
    view = c.state.vmi("default", "v")
    assert view is not None and (view.phase, view.reason) == ("Failed", NODE_UNRESPONSIVE)
    assert lifecycle.failures(c.state, DUE) == []


def test_a_vmi_whose_deletion_waits_for_its_lost_node_is_deleted_when_failed(
        handler: SyncHandler) -> None:
    c, lifecycle = lost_node_with_a_vmi(handler)
    c.run(Command(id=str(uuid.uuid4()), actor="user:erin", kind="VirtualMachineInstance",
                  verb="delete", namespace="default", name="v"))
    assert c.state.vmi("default", "v") is not None, "waiting for its node to stop it"
    assert lost(c, lifecycle) == ["n1"]
    assert lifecycle.failures(c.state, NOW) == []
    [fail] = lifecycle.failures(c.state, DUE)
    c.run(fail)
    assert c.state.vmi("default", "v") is None


def test_no_vmi_is_failed_while_every_node_is_lost_and_each_gets_its_grace_after(
        handler: SyncHandler) -> None:
    """kube's master disruption mode: every node silent is more likely the control plane's
    own fault (or a whole fleet restarting) than every host's. The first node back ends
    it; the others, still silent, get a grace from then before any is judged."""
    c = cluster(handler, ["n1", "n2"], {"a": "n1", "b": "n2"})
    lifecycle = lifecycle_hearing(handler, [])
    assert lost(c, lifecycle) == ["n1", "n2"]
    for now in (NOW, DUE, DUE + 3600):
        assert lifecycle.failures(c.state, now) == [], now

    back = DUE + 3600
    lifecycle.last_seen["n2"] = back
    [ready] = lifecycle.transitions(c.state, back)
    assert (ready.verb, ready.name) == ("ready", "n2")
    c.run(ready)
    assert lifecycle.failures(c.state, back) == []
    assert lifecycle.transitions(c.state, back + 1) == [], "n1 Ready again without a beat"
    lifecycle.last_seen["n2"] = back + 3600  # n2 beats on
    rounds = [back + second for second in range(120)]
    failing = [now for now in rounds if failed_nodes(c, lifecycle, now)]
    assert failing, "n1 is failed in the end"
    assert failing[0] >= back + NODE_MONITOR_GRACE_SECONDS
    assert failed_nodes(c, lifecycle, failing[0]) == {"n1"}


def test_a_small_zone_mostly_lost_fails_nothing_until_it_recovers(
        handler: SyncHandler) -> None:
    """Three of four nodes lost: kube's partial disruption, in a zone too small to go on
    evicting at the secondary rate. One back, and the others go one at a time, the first
after one interval of the rate (kube starts a rate drained when it was stopped)."""
    c = cluster(handler, ["n1", "n2", "n3", "n4"], {"a": "n1", "b": "n2", "c": "n3"})
    lifecycle = lifecycle_hearing(handler, ["n4"])
    assert lost(c, lifecycle) == ["n1", "n2", "n3"]
    for now in (NOW, DUE, DUE + 3600):
        assert lifecycle.failures(c.state, now) == [], now

    back = DUE + 3600
    lifecycle.last_seen["n4"] = lifecycle.last_seen["n3"] = back
    [ready] = lifecycle.transitions(c.state, back)
    c.run(ready)
    let_go = lifecycle.evictions.let_go
    assert lifecycle.failures(c.state, back) == [] and not let_go, "the rate starts drained"
    first_at = back + PRIMARY_INTERVAL
    assert lifecycle.failures(c.state, first_at) == [] and len(let_go) == 1
    [first] = let_go
    assert failed_nodes(c, lifecycle, first_at + LOST_NODE_TOLERATION_SECONDS) == {first}
    assert failed_nodes(c, lifecycle, first_at + PRIMARY_INTERVAL - 0.1) == {first}
    assert failed_nodes(c, lifecycle, first_at + PRIMARY_INTERVAL) == {first}
    assert set(let_go) == {"n1", "n2"}, "the next one a rate's interval later"


def test_a_large_zone_mostly_lost_fails_at_the_secondary_rate(handler: SyncHandler) -> None:
    nodes = [f"n{i}" for i in range(LARGE_CLUSTER_SIZE_THRESHOLD + 2)]
    alive = nodes[:len(nodes) // 3]
    c = cluster(handler, nodes, {})
    lifecycle = lifecycle_hearing(handler, alive)
    assert len(lost(c, lifecycle)) == len(nodes) - len(alive)
    lifecycle.failures(c.state, NOW)
    assert len(lifecycle.evictions.let_go) == 1
    lifecycle.failures(c.state, NOW + SECONDARY_INTERVAL - 1)
    assert len(lifecycle.evictions.let_go) == 1
    lifecycle.failures(c.state, NOW + SECONDARY_INTERVAL)
    assert len(lifecycle.evictions.let_go) == 2


def test_zones_are_judged_apart(handler: SyncHandler) -> None:
    """Zone `a` lost whole while `b` stands: `a` is failed at the normal rate (it is down,
    not the control plane). As one zone, three of four lost would fail nothing."""
    c = cluster(handler, ["a1", "a2", "a3", "b1"], {"x": "a1", "y": "a2"})
    for node in ("a1", "a2", "a3"):
        assert c.operator("label", node, labels={LABEL_TOPOLOGY_ZONE: "a"}).accepted
    assert c.operator("label", "b1", labels={LABEL_TOPOLOGY_ZONE: "b"}).accepted
    lifecycle = lifecycle_hearing(handler, ["b1"])
    assert lost(c, lifecycle) == ["a1", "a2", "a3"]
    lifecycle.failures(c.state, NOW)
    failed: set[str] = set()
    for second in range(int(DUE + 3 * PRIMARY_INTERVAL) + 1):
        failed |= failed_nodes(c, lifecycle, NOW + second)
    assert failed == {"a1", "a2"}
