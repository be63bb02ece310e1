"""Live migration through commands and read models on the real store: every phase an event,
the guest's move one atomic batch, the limits held however migrations are asked for, aborts
and refusals as KubeVirt words them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from controlplane.controllers.dispatcher import Dispatcher
from events.language.codec import decode
from events.language.kinds.migration import VirtualMachineInstanceMigrated
from events.language.messages import Command
from events.language.query import Query
from projections.cluster import ClusterState, render_vmi
from projections.hco import METRICS_QUERY, answer
from projections.rendering import migration_object, render
from tests.store.helpers import SyncHandler, run
from tests.store.migration_helpers import MIGRATION, MigratingCluster
from tests.store.test_feature_gates import apply, apply_hco
from tests.store.test_workload_update import PVC, agent

PHASES = ["Pending", "Scheduling", "Scheduled", "PreparingTarget", "TargetReady", "Running",
          "Succeeded"]


def cluster(handler: SyncHandler, nodes: int = 3) -> MigratingCluster:
    c = MigratingCluster(handler)
    for i in range(1, nodes + 1):
        c.node(f"n{i}")
    return c


def test_a_migration_moves_the_guest_through_every_phase(handler: SyncHandler) -> None:
    c = cluster(handler)
    source = c.running("web")
    assert c.user("VirtualMachine", "migrate", "web").reason == 'virtualmachine ' \
        '"default/web" not found'  # a VMI without a VM: virtctl migrate names a VM
    assert c.user("VirtualMachineInstance", "migrate", "web").accepted
    c.settle()
    m = c.migration_of("web")
    assert m.phase == "PreparingTarget" and m.target_node not in ("", source)
    assert m.metadata.name.startswith("kubevirt-migrate-vm-")
    assert c.report("web", "target-ready").outcome.accepted
    assert c.report("web", "running").outcome.accepted
    assert c.report("web", "progress", data_total=100, data_processed=40,
                    data_remaining=60).outcome.accepted
    assert c.view("web").node == source  # nothing moves before the source converges
    done = c.report("web", "converged", data_total=100)
    assert done.outcome.accepted
    m = c.migration_of("web")
    assert [phase for phase, _ in m.transitions] == PHASES
    # The guest's move and the migration's success are one batch: consecutive sequences of
    # one command, the VMI's new node in it.
    moved = [(seq, e) for seq, e in done.events if isinstance(e, VirtualMachineInstanceMigrated)]
    assert moved and moved[0][1].node == m.target_node
    seqs = [seq for seq, _ in done.events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert c.view("web").node == m.target_node
    state = c.migration_state("web")
    assert (state["sourceNode"], state["targetNode"], state["completed"], state["failed"]) == \
        (source, m.target_node, True, False)
    shown = migration_object(c.state, m)
    assert shown["status"]["phase"] == "Succeeded"
    assert shown["status"]["migrationState"]["migrationUid"] == m.uid
    assert [p["phase"] for p in shown["status"]["phaseTransitionTimestamps"]] == PHASES


def test_each_step_dispatches_the_work_of_the_node_it_concerns(handler: SyncHandler) -> None:
    c = cluster(handler)
    source = c.running("web")
    c.user("VirtualMachineInstance", "migrate", "web")
    work: list[tuple[str, str]] = []

    def dispatched(result: object) -> None:
        for _, event in getattr(result, "events", []):
            work.extend((node, verb) for node, verb, _ in
                        Dispatcher.node_commands(event, c.state))

    for command in c.migrations.resync(c.state):
        dispatched(run(c.handler, c.state, command))
    for command in c.migrations.resync(c.state):
        dispatched(run(c.handler, c.state, command))
    target = c.migration_of("web").target_node
    dispatched(c.report("web", "target-ready"))
    dispatched(c.report("web", "converged", data_total=10))
    assert work == [(target, "migrate-prepare"), (source, "migrate"),
                    (target, "migrate-finish"), (source, "migrate-cleanup")]


def test_reports_from_another_node_or_an_old_migration_change_nothing(
        handler: SyncHandler) -> None:
    c = cluster(handler)
    c.running("web")
    c.user("VirtualMachineInstance", "migrate", "web")
    c.settle()
    m = c.migration_of("web")
    bystander = ({"n1", "n2", "n3"} - {m.source_node, m.target_node}).pop()
    refused = c.report("web", "converged", node=bystander, data_total=1)
    assert not refused.outcome.accepted and "reported a migration" in refused.outcome.reason
    assert not c.report("web", "target-ready", node=m.source_node).outcome.accepted
    assert c.migration_of("web").phase == "PreparingTarget"


def test_a_vmi_that_cannot_live_migrate_says_why_and_is_refused(handler: SyncHandler) -> None:
    c = cluster(handler)
    c.running("db", {"volumes": [{"name": "data",
                                  "persistentVolumeClaim": {"claimName": "db-data"}}],
                     "domain": {"resources": {"requests": {"memory": "1Gi"}},
                                "devices": {"disks": [{"name": "data", "disk": {}}]}}})
    [condition] = [k for k in render_vmi(c.view("db"))["status"]["conditions"]
                   if k["type"] == "LiveMigratable"]
    assert (condition["status"], condition["reason"]) == ("False", "DisksNotLiveMigratable")
    refused = c.user("VirtualMachineInstance", "migrate", "db")
    assert refused.reason.startswith("Cannot migrate VMI, Reason: DisksNotLiveMigratable, "
                                     "Message: cannot migrate VMI: PVC db-data is not shared")
    assert list(c.state.migrations()) == []


def test_a_second_migration_of_one_vmi_is_refused_while_one_is_in_flight(
        handler: SyncHandler) -> None:
    c = cluster(handler)
    c.running("web")
    assert c.user("VirtualMachineInstance", "migrate", "web").accepted
    second = c.user("VirtualMachineInstance", "migrate", "web")
    assert second.reason.startswith("in-flight migration detected. Active migration job (")
    manifest = {"apiVersion": "kubevirt.io/v1", "kind": MIGRATION,
                "metadata": {"name": "mine", "namespace": "default"},
                "spec": {"vmiName": "web"}}
    assert not run(c.handler, c.state, apply(manifest)).outcome.accepted


def test_cancel_before_the_transfer_fails_it_and_after_asks_the_source(
        handler: SyncHandler) -> None:
    c = cluster(handler)
    c.running("a")
    c.running("b")
    for name in ("a", "b"):
        c.user("VirtualMachineInstance", "migrate", name)
    c.settle()
    assert c.report("b", "target-ready").outcome.accepted  # b's source transfers now
    assert c.user("VirtualMachineInstance", "migrate-cancel", "a").accepted
    assert c.migration_of("a").phase == "Failed"
    assert c.migration_state("a")["abortStatus"] == "Succeeded"

    assert c.user("VirtualMachineInstance", "migrate-cancel", "b").accepted
    assert c.migration_of("b").phase == "TargetReady"  # the source's word decides
    assert c.report("b", "failed", reason="aborted").outcome.accepted
    assert (c.migration_of("b").phase, c.migration_state("b")["abortStatus"]) == \
        ("Failed", "Succeeded")
    assert c.view("b").node == c.migration_of("b").source_node


def test_a_cancel_that_comes_too_late_leaves_the_guest_moved(handler: SyncHandler) -> None:
    c = cluster(handler)
    c.running("web")
    c.user("VirtualMachineInstance", "migrate", "web")
    c.settle()
    c.report("web", "target-ready")
    c.user("VirtualMachineInstance", "migrate-cancel", "web")
    assert c.report("web", "converged", data_total=1).outcome.accepted  # converged first
    assert c.migration_of("web").phase == "Succeeded"
    assert c.migration_state("web")["abortStatus"] == "Failed"
    assert c.view("web").node == c.migration_of("web").target_node


def test_limits_hold_however_many_migrations_are_asked_for_at_once(
        handler: SyncHandler) -> None:
    c = cluster(handler, nodes=4)
    apply_hco(c.handler, c.state, {"liveMigrationConfig": {
        "parallelMigrationsPerCluster": 3, "parallelOutboundMigrationsPerNode": 2}})
    names = [f"v{i}" for i in range(8)]
    for name in names:
        c.running(name)
    for name in names:
        assert c.user("VirtualMachineInstance", "migrate", name).accepted
    c.settle()
    running = [m for m in c.state.migrations() if m.running]
    assert len(running) == 3
    per_source: dict[str, int] = {}
    for m in running:
        per_source[m.source_node] = per_source.get(m.source_node, 0) + 1
    assert max(per_source.values()) <= 2
    # Asked directly, past the controller's own count, the handler still refuses.
    waiting = [m for m in c.state.migrations() if m.phase == "Pending"]
    for m in waiting:
        admitted = run(c.handler, c.state, Command(
            id=str(uuid.uuid4()), actor="system:controller:migration", kind=MIGRATION,
            verb="admit", namespace="default", name=m.metadata.name))
        assert not admitted.outcome.accepted
        assert "parallel" in admitted.outcome.reason
    # A finished migration frees a slot, and the oldest waiting one takes it.
    finished = running[0]
    c.report(finished.vmi_name, "target-ready")
    c.report(finished.vmi_name, "converged", data_total=1)
    c.settle()
    assert sum(m.running for m in c.state.migrations()) == 3


def test_evacuations_go_before_user_migrations(handler: SyncHandler) -> None:
    c = cluster(handler, nodes=3)
    apply_hco(c.handler, c.state, {"liveMigrationConfig": {"parallelMigrationsPerCluster": 1}})
    c.node("spare")
    first = c.running("first")
    c.running("user")
    c.running("evacuee")
    c.user("VirtualMachineInstance", "migrate", "first")
    c.settle()  # "first" holds the one slot
    c.user("VirtualMachineInstance", "migrate", "user")
    evacuee = c.view("evacuee")
    run(c.handler, c.state, Command(
        id=str(uuid.uuid4()), actor="system:controller:evacuation", kind=MIGRATION,
        verb="create-for-evacuation", namespace="default", name="evacuee",
        manifest={"vmi_name": "evacuee", "node": evacuee.node}))
    c.report("first", "target-ready")
    c.report("first", "converged", data_total=1)
    assert c.view("first").node != first
    c.settle()
    assert c.migration_of("evacuee").running and c.migration_of("user").phase == "Pending"


def test_a_lost_source_node_fails_the_migration(handler: SyncHandler) -> None:
    c = cluster(handler)
    source = c.running("web")
    c.user("VirtualMachineInstance", "migrate", "web")
    c.settle()
    run(c.handler, c.state, Command(
        id=str(uuid.uuid4()), actor="system:controller:node-lifecycle", kind="Node",
        verb="not-ready", name=source, manifest={"reason": "NodeStatusUnknown"}))
    c.settle()
    m = c.migration_of("web")
    assert (m.phase, m.reason) == ("Failed", f"the source node {source} is NotReady")
    assert c.migration_state("web")["failed"] is True


def test_a_hand_over_reported_after_the_migration_failed_moves_the_guest(
        handler: SyncHandler) -> None:
    """A real source's libvirt hands the guest over while the log fails the migration (its
    target node NotReady): the source's late `converged` says where the guest runs, so the
    migration Succeeded, the VMI is on the target, and the nodes finish and clean up."""
    c = cluster(handler)
    source = c.running("web")
    c.user("VirtualMachineInstance", "migrate", "web")
    c.settle()
    assert c.report("web", "target-ready").outcome.accepted
    assert c.report("web", "running").outcome.accepted
    target = c.migration_of("web").target_node
    run(c.handler, c.state, Command(
        id=str(uuid.uuid4()), actor="system:controller:node-lifecycle", kind="Node",
        verb="not-ready", name=target, manifest={"reason": "NodeStatusUnknown"}))
    c.settle()
    assert c.migration_of("web").phase == "Failed"
    assert c.view("web").node == source

    late = c.report("web", "converged", data_total=10)
    assert late.outcome.accepted, late.outcome.reason
    assert c.migration_of("web").phase == "Succeeded"
    assert c.view("web").node == target
    state = c.migration_state("web")
    assert (state["completed"], state["failed"], state.get("failureReason")) == \
        (True, False, None)
    work = [(node, verb) for _, event in late.events
            for node, verb, _ in Dispatcher.node_commands(event, c.state)]
    assert work == [(target, "migrate-finish"), (source, "migrate-cleanup")]
    again = c.report("web", "converged", data_total=10)
    assert not again.outcome.accepted and "already finished" in again.outcome.reason


def test_a_late_hand_over_of_a_vmi_no_longer_on_its_source_changes_nothing(
        handler: SyncHandler) -> None:
    c = cluster(handler)
    source = c.running("web")
    c.user("VirtualMachineInstance", "migrate", "web")
    c.settle()
    c.report("web", "target-ready")
    run(c.handler, c.state, Command(  # as the node controller fails a lost node's VMIs
        id=str(uuid.uuid4()), actor="system:controller:node", kind="VirtualMachineInstance",
        verb="fail", namespace="default", name="web", manifest={"reason": "NodeUnresponsive"}))
    c.settle()  # the migration fails with its VMI
    assert c.migration_of("web").phase == "Failed"
    late = c.report("web", "converged", data_total=10)
    assert not late.outcome.accepted
    assert "no longer on the source node" in late.outcome.reason
    assert (c.migration_of("web").phase, c.view("web").node) == ("Failed", source)


def test_migration_metrics_are_functions_of_the_log(handler: SyncHandler) -> None:
    c = cluster(handler)
    c.running("web")
    c.running("db")
    for name in ("web", "db"):
        c.user("VirtualMachineInstance", "migrate", name)
    c.settle()
    c.report("web", "target-ready")
    c.report("web", "converged", data_total=64)
    text = answer(c.state, METRICS_QUERY, "", datetime.now(UTC))[0]["text"]
    web = c.migration_of("web").metadata.name
    assert f'kubevirt_vmi_migration_succeeded{{namespace="default",vmi="web",vmim="{web}"}} 1.0' \
        in text
    assert "kubevirt_vmi_migrations_in_scheduling_phase 1.0" in text  # db, preparing
    assert f'kubevirt_vmi_migration_data_total_bytes{{namespace="default",vmi="web",' \
           f'vmim="{web}"}} 64.0' in text
    replayed = ClusterState()
    for stored in handler.recorder.select_notifications(1, 10_000):
        replayed.apply(decode(stored.topic, stored.state), stored.id)
    assert answer(replayed, METRICS_QUERY, "", datetime.now(UTC))[0]["text"] == text


def test_eviction_metrics_name_what_a_drain_cannot_move_and_count_the_outdated(
        handler: SyncHandler) -> None:
    """KubeVirt's `kubevirt_vmi_non_evictable`: 1 for a VMI whose eviction strategy is
    LiveMigrate (the cluster's on three nodes) and that cannot live-migrate, 0 for one that
    can or that may be shut down instead; `kubevirt_vmi_number_of_outdated` counts the VMIs
    an agent upgrade left behind."""
    c = cluster(handler)
    nodes = {"web": c.running("web"), "db": c.running("db", PVC),
             "batch": c.running("batch", {**PVC, "evictionStrategy": "LiveMigrateIfPossible"})}

    def samples() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        [item] = render(c.state, Query(kind=METRICS_QUERY))
        return {family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
                for family in text_string_to_metric_families(item["text"])}

    found = samples()
    assert found["kubevirt_vmi_non_evictable"] == {
        (("name", name), ("namespace", "default"), ("node", node)): float(name == "db")
        for name, node in nodes.items()}
    assert found["kubevirt_vmi_number_of_outdated"] == {(): 0.0}
    agent(c, nodes["db"], "v2")  # its agent upgraded: what it launched is outdated
    outdated = sum(node == nodes["db"] for node in nodes.values())
    assert samples()["kubevirt_vmi_number_of_outdated"] == {(): float(outdated)}
