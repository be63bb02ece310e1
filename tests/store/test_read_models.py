"""The read side's Node: what its VMIs hold is counted under the node's own name, also when
that name is not a subject-safe token (a host's FQDN)."""

from __future__ import annotations

import uuid

from controlplane.controllers.scheduler import Scheduler
from controlplane.vm.controller import VMController
from events.language.messages import Command
from projections.cluster import ClusterState
from projections.rendering import node_object
from tests.store.helpers import SyncHandler, register_command, run_accepted
from tests.system.harness import vm_manifest

HOST = "worker-1.example.com"


def test_a_node_with_a_dotted_name_counts_its_vmis(handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, register_command(HOST))
    run_accepted(handler, state, Command(id=str(uuid.uuid4()), actor="user:erin",
                                         kind="VirtualMachine", verb="apply",
                                         namespace="default", name="web",
                                         manifest=vm_manifest("web")))
    [create] = VMController().resync(state)
    run_accepted(handler, state, create)
    [schedule] = Scheduler().resync(state)
    assert schedule.manifest == {"node": HOST}
    run_accepted(handler, state, schedule)
    [node] = state.nodes()
    obj = node_object(state, node)
    assert obj["metadata"]["name"] == HOST
    assert obj["status"]["allocated"]["vmis"] == "1"
