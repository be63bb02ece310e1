"""The scheduler's ledger folded change by change, as the control loop shows it events one at a
time: it never over-commits a node, frees what an ended VMI held, always equals the ledger
built from the read model afresh, and asks the node-only filters again once a node changes."""

from __future__ import annotations

import uuid

from controlplane.scheduling.ledger import Ledger
from events.language.messages import Command
from projections.hco import cluster_tuning
from tests.store.helpers import SyncHandler
from tests.store.scheduling_helpers import SMALL, Cluster
from tests.store.test_feature_gates import apply, vmi


def fail(name: str) -> Command:
    return Command(id=str(uuid.uuid4()), actor="system:controller:node-lifecycle",
                   kind="VirtualMachineInstance", verb="fail", namespace="default",
                   name=name, manifest={"reason": "NodeUnresponsive"})


def held(ledger: Ledger) -> dict[str, tuple[dict[str, int], set[str]]]:
    """Each node's non-zero amounts and the VMIs holding them."""
    return {name: ({r: a for r, a in usage.amounts.items() if a}, set(usage.pods))
            for name, usage in ledger.usage.items()}


def live(handler: SyncHandler, memory: str) -> Cluster:
    """One node with `memory`, the scheduler observing the read model from now on."""
    c = Cluster(handler)
    c.node("n1", memory=memory)
    assert c.schedule() == []
    return c


def test_vmis_decided_one_event_at_a_time_never_overcommit_a_node(
        handler: SyncHandler) -> None:
    c = live(handler, "3Gi")
    for name in ("a", "b", "c"):
        c.follow(apply(vmi(name, SMALL)))
    assert [n for n in ("a", "b", "c") if c.node_of(n)] == ["a", "b"]
    assert c.message("c") == "0/1 nodes are available: 1 Insufficient memory."


def test_what_an_ended_vmi_held_is_free_at_its_event(handler: SyncHandler) -> None:
    c = live(handler, "2Gi")
    c.follow(apply(vmi("a", SMALL)))
    c.follow(apply(vmi("b", SMALL)))
    assert c.node_of("a") == "n1" and not c.node_of("b")
    c.follow(fail("a"))
    assert c.node_of("b") == "n1"


def test_the_folded_ledger_is_the_ledger_built_afresh(handler: SyncHandler) -> None:
    c = live(handler, "3Gi")
    c.node("n2", memory="4Gi")
    for name in ("a", "b", "c", "d", "e"):
        c.follow(apply(vmi(name, SMALL)))
    c.follow(fail("a"))
    assert c.operator("label", "n2", labels={"disk": "ssd"}).accepted
    c.follow(apply(vmi("f", {**SMALL, "nodeSelector": {"disk": "ssd"}})))
    c.follow(fail("c"))
    tuning = cluster_tuning(c.state)
    folded = held(c.scheduler.ledger(c.state, tuning))
    assert folded == held(Ledger.of(c.state.nodes(), c.state.vmis(), tuning))
    assert sum(len(vmis) for _, vmis in folded.values()) == 4  # b, d, e, f


def test_a_node_labelled_later_takes_the_vmi_waiting_for_the_label(
        handler: SyncHandler) -> None:
    """What the node-only filters said of a node is asked again once the node changes."""
    c = live(handler, "3Gi")
    c.follow(apply(vmi("ssd", {**SMALL, "nodeSelector": {"disk": "ssd"}})))
    assert c.message("ssd") == ("0/1 nodes are available: 1 node(s) didn't match Pod's node "
                                "affinity/selector.")
    c.follow(Command(id=str(uuid.uuid4()), actor="user:erin", kind="Node", verb="label",
                     name="n1", manifest={"labels": {"disk": "ssd"}}))
    assert c.node_of("ssd") == "n1"
