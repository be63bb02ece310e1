"""The node lifecycle controller's decisions on the real store: a lost node's VMIs are failed
once the log shows the node NotReady, asked for on every round until they are
(level-triggered), each by one command however often it is decided; a VMI whose deletion
waited for that node is deleted with it."""

from __future__ import annotations

import math
import uuid

from controlplane.node.controller import NodeLifecycle
from events.messages import Command
from events.vm import NODE_UNRESPONSIVE
from tests.store.helpers import SyncHandler
from tests.store.scheduling_helpers import Cluster

NOW = 0.0
"""The instant rounds judge at: any, since the controller never heard from `n1`."""


def lost_node_with_a_vmi(handler: SyncHandler) -> tuple[Cluster, NodeLifecycle]:
    """Node `n1` running VMI `v`, and a lifecycle controller that never heard from it."""
    c = Cluster(handler)
    c.node("n1")
    c.vmi("v")
    c.schedule()
    assert c.node_of("v") == "n1"
    lifecycle = NodeLifecycle(handler.bridge.nc, handler.handler.log.layout)
    lifecycle.started = -math.inf
    return c, lifecycle


def test_a_lost_nodes_vmis_are_failed_every_round_until_they_are(
        handler: SyncHandler) -> None:
    c, lifecycle = lost_node_with_a_vmi(handler)
    assert lifecycle.failures(c.state, NOW) == [], "not while the node is Ready in the log"
    [not_ready] = lifecycle.transitions(c.state, NOW)
    c.run(not_ready)
    assert lifecycle.transitions(c.state, NOW) == []

    [fail] = lifecycle.failures(c.state, NOW)
    [again] = lifecycle.failures(c.state, NOW)  # a round later, or a control plane restarted
    assert (fail.verb, again.id) == ("fail", fail.id)
    first = c.run(fail).outcome
    assert handler.execute(again).outcome == first
    view = c.state.vmi("default", "v")
    assert view is not None and (view.phase, view.reason) == ("Failed", NODE_UNRESPONSIVE)
    assert lifecycle.failures(c.state, NOW) == []


def test_a_vmi_whose_deletion_waits_for_its_lost_node_is_deleted_when_failed(
        handler: SyncHandler) -> None:
    c, lifecycle = lost_node_with_a_vmi(handler)
    c.run(Command(id=str(uuid.uuid4()), actor="user:erin", kind="VirtualMachineInstance",
                  verb="delete", namespace="default", name="v"))
    assert c.state.vmi("default", "v") is not None, "waiting for its node to stop it"
    [not_ready] = lifecycle.transitions(c.state, NOW)
    c.run(not_ready)
    [fail] = lifecycle.failures(c.state, NOW)
    c.run(fail)
    assert c.state.vmi("default", "v") is None
