"""Workload updates through commands and read models on the real store: after an agent
upgrade the VMIs its older version launched are outdated, migrate when they can, and are
evicted in batches sized and spaced as the strategy says; an empty method list does nothing."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

from controlplane.workloadupdate.controller import WorkloadUpdater
from events.language.messages import Command
from events.language.query import Query
from projections.cluster import OUTDATED_LAUNCHER_LABEL
from projections.kinds.migration import WorkloadUpdateView
from projections.rendering import render
from tests.store.helpers import SyncHandler, node_info, run
from tests.store.migration_helpers import MigratingCluster
from tests.store.test_feature_gates import apply_hco

PVC = {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
       "domain": {"resources": {"requests": {"memory": "1Gi"}},
                  "devices": {"disks": [{"name": "data", "disk": {}}]}}}


def agent(c: MigratingCluster, node: str, version: str) -> None:
    """Node `node`'s agent (re)registering at `version`."""
    info = {**node_info(node), "agentVersion": version}
    assert run(c.handler, c.state, Command(
        id=str(uuid.uuid4()), actor=f"system:node:{node}", kind="Node", verb="register",
        name=node, manifest=info)).outcome.accepted


def upgraded_cluster(handler: SyncHandler, strategy: dict[str, object]) -> MigratingCluster:
    """`mover` can migrate, `pinned1..3` cannot; all launched by v1 on n1, then n1 and n2's
    agents upgraded to v2."""
    c = MigratingCluster(handler)
    apply_hco(c.handler, c.state, {"workloadUpdateStrategy": strategy})
    agent(c, "n1", "v1")
    c.running("mover")
    for i in (1, 2, 3):
        c.running(f"pinned{i}", PVC)
    agent(c, "n1", "v2")
    agent(c, "n2", "v2")
    return c


def outdated_names(c: MigratingCluster) -> set[str]:
    vmis = render(c.state, Query(kind="VirtualMachineInstance"))
    return {v["metadata"]["name"] for v in vmis
            if OUTDATED_LAUNCHER_LABEL in v["metadata"].get("labels", {})}


def batches(c: MigratingCluster) -> list[tuple[datetime, list[str]]]:
    view = next((v for v in c.state.views.values() if isinstance(v, WorkloadUpdateView)), None)
    return view.batches if view is not None else []


def test_outdated_vmis_migrate_or_are_evicted_in_spaced_batches(handler: SyncHandler) -> None:
    c = upgraded_cluster(handler, {"workloadUpdateMethods": ["LiveMigrate", "Evict"],
                                   "batchEvictionSize": 2, "batchEvictionInterval": "300ms"})
    assert outdated_names(c) == {"mover", "pinned1", "pinned2", "pinned3"}
    updater = WorkloadUpdater()
    for command in updater.resync(c.state):
        run(c.handler, c.state, command)
    assert c.migration_of("mover").priority == "workload-update"
    [first] = updater.tick(c.state, datetime.now(UTC))
    assert run(c.handler, c.state, first).outcome.accepted
    assert batches(c)[0][1] == ["default/pinned1", "default/pinned2"]
    assert c.view("pinned1").deletion_requested_at is not None
    assert updater.tick(c.state, datetime.now(UTC)) == []  # not yet: the interval
    # Asked directly, before the interval has passed, the handler refuses the batch.
    early = run(c.handler, c.state, Command(
        id=str(uuid.uuid4()), actor="system:controller:workload-updater",
        kind="WorkloadUpdate", verb="evict-batch", name="cluster",
        manifest={"vmis": ["default/pinned3"]}))
    assert not early.outcome.accepted and "batchEvictionInterval" in early.outcome.reason
    deadline = time.monotonic() + 10
    while not (due := updater.tick(c.state, datetime.now(UTC))):  # the clock must pass
        assert time.monotonic() < deadline, "no second batch"
        time.sleep(0.05)  # poll interval of a clock condition
    assert run(c.handler, c.state, due[0]).outcome.accepted
    (at1, _), (at2, second) = batches(c)
    assert second == ["default/pinned3"] and (at2 - at1).total_seconds() >= 0.3


def test_a_migrated_vmi_is_current_again(handler: SyncHandler) -> None:
    c = upgraded_cluster(handler, {"workloadUpdateMethods": ["LiveMigrate"]})
    for command in WorkloadUpdater().resync(c.state):
        run(c.handler, c.state, command)
    c.settle()
    c.report("mover", "target-ready")
    c.report("mover", "converged", data_total=1)
    assert "mover" not in outdated_names(c)
    assert c.view("mover").launcher_version == "v2"
    assert WorkloadUpdater().tick(c.state, datetime.now(UTC)) == []  # Evict not a method


def test_an_empty_method_list_updates_nothing(handler: SyncHandler) -> None:
    c = upgraded_cluster(handler, {"workloadUpdateMethods": []})
    assert outdated_names(c)
    updater = WorkloadUpdater()
    assert updater.resync(c.state) == [] and updater.tick(c.state, datetime.now(UTC)) == []
