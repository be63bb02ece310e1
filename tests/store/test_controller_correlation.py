"""A controller acting on an object later (after a replay, or when a node appears) carries
the correlation id of the request that last changed the object, not one of its own."""

from __future__ import annotations

import uuid

from controlplane.controllers.scheduler import Scheduler
from controlplane.vm.controller import VMController
from events.language.messages import Command
from projections.cluster import ClusterState
from tests.store.helpers import SyncHandler, register_command, run_accepted
from tests.system.harness import vm_manifest


def test_resyncs_carry_the_request_that_last_changed_the_object(
        handler: SyncHandler) -> None:
    state = ClusterState()
    apply = Command(id=str(uuid.uuid4()), actor="user:erin", kind="VirtualMachine",
                    verb="apply", namespace="default", name="web", manifest=vm_manifest("web"))
    run_accepted(handler, state, apply)
    [create] = VMController().resync(state)
    assert (create.verb, create.correlation_id) == ("create-for-vm", apply.id)
    run_accepted(handler, state, create)
    [unschedulable] = Scheduler().resync(state)  # no node yet
    assert (unschedulable.verb, unschedulable.correlation_id) == ("unschedulable", apply.id)
    run_accepted(handler, state, register_command("n1"))
    [schedule] = Scheduler().resync(state)
    assert schedule.manifest == {"node": "n1"}
    assert schedule.correlation_id == apply.id
