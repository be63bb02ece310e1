"""Node failure: a node whose agent falls silent goes NotReady, its VMIs fail with
NodeUnresponsive, an Always VM comes back on the other node exactly once, and the node,
when it is back, destroys the guests it still runs rather than run them twice. Also when
the control plane died between appending NotReady and failing the VMIs.

Two VMIs sit on the node that fails: a VM's (runStrategy Always, so renewed elsewhere) and
a standalone one pinned there (failed, not renewed: nothing deletes it, so only the node
being told that it failed removes its guest). Nothing is created twice: the log holds two
instances of the VM's VMI and one of the standalone's."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

from controlplane.node.controller import NodeLifecycle
from controlplane.user.client import Client
from controlplane.writer import Writer
from events.api.scheduling import LABEL_HOSTNAME
from events.language.kinds.nodes import NODE_KIND
from events.language.kinds.vm import NODE_UNRESPONSIVE
from events.language.messages import Command
from events.language.subjects import aggregate_id
from projections.cluster import ClusterState
from projections.kinds.vm import NodeView
from tests.system.harness import (
    System,
    eventually,
    hosted,
    no_domains,
    node_ready,
    replaced,
    vm_manifest,
    vmi_absent,
    vmi_phase,
)

CREATED = "VirtualMachineInstanceCreated"
NODE_GRACE_SECONDS = 6.0
"""Three heartbeats: one that a loaded machine delays must not make the node that stays up
NotReady too (its VMI would be replaced once more)."""


def pinned_vmi(name: str, node: str) -> dict[str, Any]:
    """A standalone VMI that only `node` may run."""
    spec = vm_manifest(name, nodeSelector={LABEL_HOSTNAME: node})["spec"]["template"]["spec"]
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


async def creations(vb: Client, name: str) -> int:
    """How many instances VMI `name` has had, from the log."""
    return sum(e.type == CREATED for e in
               await vb.history("VirtualMachineInstance", "default", name))


async def failed_unresponsive(vb: Client, name: str) -> dict[str, Any] | None:
    vmi = await vmi_phase(vb, name, "Failed")
    return vmi if vmi and vmi["status"].get("reason") == NODE_UNRESPONSIVE else None


async def two_guests_on_one_node(vb: Client) -> tuple[str, str, str]:
    """The VM `always` and the VMI `solo` Running on one node: (that node, the other, the
    uid of `always`'s VMI)."""
    await vb.apply(vm_manifest("always"))
    vmi = await eventually(lambda: vmi_phase(vb, "always", "Running"), what="always Running")
    node = vmi["status"]["nodeName"]
    await vb.apply(pinned_vmi("solo", node))
    await eventually(lambda: vmi_phase(vb, "solo", "Running"), what="solo Running")
    other = "node-2" if node == "node-1" else "node-1"
    return node, other, vmi["metadata"]["uid"]


async def failed_over(vb: Client, node: str, other: str, uid: str) -> str:
    """Both VMIs of the lost `node` failed NodeUnresponsive, `always` Running on `other` as
    its second instance, and nothing more created; the new instance's uid."""
    await eventually(lambda: failed_unresponsive(vb, "solo"), what="solo failed")
    moved = await eventually(lambda: replaced(vb, "always", uid), what="always replaced")
    assert moved["status"]["nodeName"] == other
    assert NODE_UNRESPONSIVE in [
        c["value"] for e in await vb.history("VirtualMachineInstance", "default", "always")
        for c in e.changes if c["path"] == "/status/reason" and c["op"] != "remove"]
    assert (await creations(vb, "always"), await creations(vb, "solo")) == (2, 1)
    return str(moved["metadata"]["uid"])


async def node_back_clean(vb: Client, node: str, uid: str) -> None:
    """`node` Ready again and its stale guests destroyed; the renewed VMI `uid` runs once,
    elsewhere, and nothing was created again."""
    await eventually(lambda: node_ready(vb, node, True), what=f"{node} Ready again")
    await eventually(lambda: no_domains(vb, node), what=f"the stale guests on {node} destroyed")
    assert len(await hosted(vb, uid)) == 1
    assert (await creations(vb, "always"), await creations(vb, "solo")) == (2, 1)
    assert (await vb.get("VirtualMachineInstance", "default", "solo"))["status"]["phase"] \
        == "Failed"


async def test_a_silent_node_fails_over_once_and_destroys_its_stale_guests(
        system: System, vb: Client) -> None:
    """The agent hangs (SIGSTOP): alive and connected, it does not restart when it resumes,
    so nothing of its own start-up reconciling runs; what the control plane dispatched
    meanwhile is what makes it destroy its stale guests."""
    node, other, uid = await two_guests_on_one_node(vb)
    system.freeze(node)
    try:
        await eventually(lambda: node_ready(vb, node, False), what=f"{node} NotReady")
        renewed = await failed_over(vb, node, other, uid)
    finally:
        system.thaw(node)
    await node_back_clean(vb, node, renewed)


async def not_ready_as_the_controller_decides(writer: Writer, node: str) -> None:
    """Append what the node lifecycle controller appends for `node` once its grace is over,
    decided by its own code: the log a control plane leaves that died right after it."""
    log = writer.handler.log
    view = await writer.handler.memory.load(aggregate_id(NODE_KIND, "", node), NodeView)
    state = ClusterState()
    state.views[view.id] = view
    lifecycle = NodeLifecycle(log.nc, log.layout)
    lifecycle.started = -math.inf  # every node silent since ever
    [command] = lifecycle.transitions(state, time.monotonic())
    assert command.verb == "not-ready"
    result = await writer.execute(command)
    assert result.outcome.accepted, result.outcome


async def test_a_control_plane_dead_between_not_ready_and_the_fails_fails_them_on_restart(
        system: System, vb: Client) -> None:
    """Also a VMI whose deletion was asked while its node was lost (its VM stopped, or
    restarted): no node reports it gone, so failing it deletes it."""
    node, other, uid = await two_guests_on_one_node(vb)
    await vb.apply(pinned_vmi("doomed", node))
    await eventually(lambda: vmi_phase(vb, "doomed", "Running"), what="doomed Running")
    system.kill("controlplane")
    system.kill(node)
    writer = Writer(vb.nc, vb.layout)
    delete = Command(id=str(uuid.uuid4()), actor="user:alice", kind="VirtualMachineInstance",
                     verb="delete", namespace="default", name="doomed")
    deleting = await writer.execute(delete)
    assert [e.TYPE for _, e in deleting.events] == ["VirtualMachineInstanceDeletionRequested"], \
        "waiting for its node to stop it"
    await not_ready_as_the_controller_decides(writer, node)
    await eventually(lambda: node_ready(vb, node, False), what=f"{node} NotReady")
    assert (await vmi_phase(vb, "solo", "Running")) and (await vmi_phase(vb, "always", "Running"))

    system.start("controlplane")
    renewed = await failed_over(vb, node, other, uid)
    await eventually(lambda: vmi_absent(vb, "doomed"), what="doomed deleted")

    # The agent restarted: its host kept in a file, it finds the stale guests and destroys
    # them, however it learns of it first (its start-up reconcile, or the stops queued).
    system.start(node)
    await node_back_clean(vb, node, renewed)
