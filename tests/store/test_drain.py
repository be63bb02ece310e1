"""Draining a node through commands and read models on the real store: each VMI leaves by
its eviction strategy, a VMI that cannot leave blocks the drain and says why, the drain ends
when nothing evictable is left, and one correlation id ties everything it caused."""

from __future__ import annotations

import uuid

import msgspec

from events.language.messages import Command, DomainObservation, node_actor
from projections.eviction import drain_progress
from tests.store.helpers import SyncHandler, run
from tests.store.migration_helpers import MigratingCluster

PVC = {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
       "domain": {"resources": {"requests": {"memory": "1Gi"}},
                  "devices": {"disks": [{"name": "data", "disk": {}}]}}}


def drain(c: MigratingCluster, node: str) -> Command:
    command = Command(id=str(uuid.uuid4()), actor="user:erin", kind="Node", verb="drain",
                      name=node)
    assert run(c.handler, c.state, command).outcome.accepted
    return command


def strategy(name: str) -> dict[str, object]:
    return {"evictionStrategy": name}


def test_each_vmi_leaves_by_its_eviction_strategy(handler: SyncHandler) -> None:
    c = MigratingCluster(handler)
    c.node("n1")
    for name, spec in (("live", strategy("LiveMigrate")), ("stuck", {**PVC, **strategy(
            "LiveMigrate")}), ("maybe", {**PVC, **strategy("LiveMigrateIfPossible")}),
            ("none", strategy("None")), ("ext", strategy("External"))):
        c.running(name, spec)
    c.node("n2")
    request = drain(c, "n1")
    proposed = c.settle()
    verbs = {(cmd.verb, cmd.name) for cmd in proposed if cmd.kind != "Node"}
    assert ("delete", "none") in verbs and ("delete", "maybe") in verbs
    assert ("evacuate", "ext") in verbs and ("create-for-evacuation", "live") in verbs
    assert not any(name == "stuck" for _, name in verbs)
    assert {cmd.correlation_id for cmd in proposed} == {request.id}
    assert c.migration_of("live").priority == "evacuation"
    assert c.view("ext").evacuation_node == "n1"
    progress = drain_progress(c.state, "n1")
    assert progress.blocked == {"default/stuck": (
        "DisksNotLiveMigratable: cannot migrate VMI: PVC data is not shared, live migration "
        "requires that all PVCs must be shared (using ReadWriteMany access mode)")}
    assert not progress.done
    node = c.state.node("n1")
    assert node is not None and node.unschedulable and node.draining


def test_the_drain_ends_when_nothing_evictable_is_left(handler: SyncHandler) -> None:
    c = MigratingCluster(handler)
    c.node("n1")
    c.running("web", strategy("LiveMigrate"))
    c.running("ext", strategy("External"))
    c.node("n2")
    drain(c, "n1")
    c.settle()
    assert not drain_progress(c.state, "n1").done
    c.report("web", "target-ready")
    c.report("web", "converged", data_total=1)
    c.settle()
    assert c.view("web").node == "n2"
    assert drain_progress(c.state, "n1").done  # only the External VMI, marked, is left
    node = c.state.node("n1")
    assert node is not None and not node.draining and node.unschedulable


def test_a_failed_evacuation_is_tried_again(handler: SyncHandler) -> None:
    c = MigratingCluster(handler)
    c.node("n1")
    c.running("web", strategy("LiveMigrate"))
    c.node("n2")
    drain(c, "n1")
    c.settle()
    first = c.migration_of("web")
    c.report("web", "failed", node=first.target_node, reason="target could not prepare")
    c.settle()
    again = [m for m in c.state.migrations() if m.vmi_name == "web"]
    assert len(again) == 2 and sum(not m.finished for m in again) == 1


def test_a_no_execute_taint_evicts_what_does_not_tolerate_it(handler: SyncHandler) -> None:
    c = MigratingCluster(handler)
    c.node("n1")
    c.running("plain", strategy("LiveMigrate"))
    c.running("tolerant", {**strategy("None"), "tolerations": [
        {"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}]})
    c.node("n2")
    assert c.operator("taint", "n1", add=[{"key": "maintenance", "value": "now",
                                           "effect": "NoExecute"}]).accepted
    proposed = c.settle()
    assert {(cmd.verb, cmd.name) for cmd in proposed if cmd.kind != "Node"} >= {
        ("create-for-evacuation", "plain")}
    assert not any(cmd.name == "tolerant" for cmd in proposed)
    assert c.migration_of("plain").priority == "evacuation"


def test_a_vmis_change_is_looked_at_while_a_node_evicts_however_its_drain_was_folded(
        handler: SyncHandler) -> None:
    """The evacuation controller looks at a VMI's change only while some node drains (or
    has a NoExecute taint), which it folds from the read model's changes: a drain folded in
    without being shown to it (another controller's write, a batch's earlier event) still
    has the node's VMIs evicted at their next change; with no node evicting, nothing."""
    c = MigratingCluster(handler)
    c.node("n1")
    c.vmi("gone", strategy("None"))
    c.schedule()
    [(_, changed), *_] = c.run(Command(
        id=str(uuid.uuid4()), actor=node_actor("n1"), kind="VirtualMachineInstance",
        verb="observe", namespace="default", name="gone",
        manifest=msgspec.to_builtins(DomainObservation(
            namespace="default", name="gone", uid=c.view("gone").uid,
            phase="Running")))).events
    assert c.evacuation.resync(c.state) == []  # observing from now on
    assert c.evacuation.on_event(c.state, changed) == []
    drain(c, "n1")  # folded into the read model only
    decided = c.evacuation.on_event(c.state, changed)
    assert [(cmd.verb, cmd.name) for cmd in decided] == [("delete", "gone")]
