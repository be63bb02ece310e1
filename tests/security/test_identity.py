"""Identity comes from where a message was published, not from what it says, and the policy
decides the rest (issue 8, findings 2 and 3), on a real nats-server and the real intake:

- internal verbs (`Node register`, `VirtualMachineInstance observe`, ...) and `system:` actors
  are the control plane's own, refused from the command stream;
- a node report names its node by subject; one whose body names another node is dead-lettered;
- a report about a VMI counts only from the node the VMI is on;
- a user may do only what the RBAC policy grants, in the namespaces it grants it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from controlplane.intake import CommandIntake, ReportIntake, report_command
from controlplane.user.client import Client
from controlplane.writer import Writer
from events.authorization.policy import Policy, load_policy, parse_policy
from events.jetstream.directget import read_all
from events.jetstream.streams import ensure_all
from events.language.kinds.nodes import NODE_KIND
from events.language.messages import Command, DomainObservation, NodeReport
from events.language.subjects import Layout, aggregate_id
from tests.store.helpers import node_info
from tests.system.harness import eventually, topics_since, vm_manifest

POLICY = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "policy.yaml"


class Installation:
    """A control plane that runs only its intakes, and a way to connect as anyone."""

    def __init__(self, nats_url: str, layout: Layout, writer: Writer) -> None:
        self.nats_url, self.layout, self.writer = nats_url, layout, writer

    async def client(self, actor: str) -> Client:
        return await Client.connect(self.nats_url, self.layout.prefix, actor=actor)


async def _installation(nats_url: str, prefix: str, policy: Policy
                        ) -> AsyncIterator[Installation]:
    admin = await Client.connect(nats_url, prefix, actor="setup")
    await ensure_all(admin.js, admin.layout)
    writer = Writer(admin.nc, admin.layout)
    stop = asyncio.Event()
    parts = asyncio.gather(CommandIntake(admin.nc, admin.layout, writer, policy).run(stop),
                           ReportIntake(admin.nc, admin.layout, writer).run(stop))
    try:
        yield Installation(nats_url, admin.layout, writer)
    finally:
        stop.set()
        await parts
        await admin.close()


@pytest.fixture
async def open_install(nats_url: str, prefix: str) -> AsyncIterator[Installation]:
    """No policy configured: every user may do everything (a development install)."""
    async for installation in _installation(nats_url, prefix, Policy.open()):
        yield installation


@pytest.fixture
async def secured_install(nats_url: str, prefix: str) -> AsyncIterator[Installation]:
    """The shipped example policy: operator everywhere, alice edits and bob views and
    powers tenant-a."""
    async for installation in _installation(nats_url, prefix, load_policy(POLICY)):
        yield installation


@pytest.mark.parametrize(("kind", "verb", "manifest"), [
    ("Node", "register", node_info("fake")),
    ("Node", "not-ready", {}),
    ("VirtualMachineInstance", "schedule", {"node": "fake"}),
    ("VirtualMachineInstance", "observe", {"namespace": "default", "name": "web", "uid": "u",
                                           "gone": True}),
    ("HyperConverged", "status", {}),
])
async def test_internal_verbs_are_refused_from_the_command_stream(
        open_install: Installation, kind: str, verb: str, manifest: dict[str, object]) -> None:
    vb = await open_install.client("mallory")
    try:
        head = (await vb.js.stream_info(vb.layout.events_stream)).state.last_seq
        name = "fake" if kind == "Node" else "web"
        outcome = await vb.run(vb.command(kind, verb, "" if kind == "Node" else "default",
                                          name, manifest=manifest), check=False)
        assert (outcome.accepted, outcome.field) == (False, "verb"), outcome
        assert "decided by the control plane itself" in outcome.reason
        assert await topics_since(vb, head) == ["CommandRejected.v1"]
    finally:
        await vb.close()


async def test_system_actors_are_refused_from_the_command_stream(
        open_install: Installation) -> None:
    """Even on its own subject: no client may speak as a controller or a node."""
    for actor in ("system:controller:vm", "system:node:n1"):
        vb = await open_install.client(actor)
        try:
            outcome = await vb.run(vb.command("VirtualMachine", "apply", "default", "web",
                                              manifest=vm_manifest("web", "Halted")),
                                   check=False)
            assert (outcome.accepted, outcome.field) == (False, "actor"), outcome
        finally:
            await vb.close()


async def test_a_report_names_its_node_by_subject(open_install: Installation) -> None:
    """`n2`'s agent registering a fake `n3` (finding 3): dead-lettered, no node appears."""
    vb = await open_install.client("operator")
    try:
        layout = vb.layout
        forged = NodeReport(id=str(uuid.uuid4()), node="n3", kind="node", info=node_info("n3"))
        await vb.js.publish(layout.report_subject("n2", "node"), msgspec.msgpack.encode(forged))
        honest = NodeReport(id=str(uuid.uuid4()), node="n2", kind="node", info=node_info("n2"))
        await vb.js.publish(layout.report_subject("n2", "node"), msgspec.msgpack.encode(honest))

        async def dead() -> list[str]:
            msgs = await read_all(vb.nc, layout.dead_letter_stream,
                                  layout.dead_letter_subject(layout.reports_stream))
            return [(m.headers or {})["Vb-Reason"] for m in msgs]

        assert await eventually(dead, timeout=20, what="the forged report's dead letter") == [
            "node: the report names 'n3', its subject 'n2'"]

        async def nodes() -> set[str]:
            msgs = await read_all(vb.nc, layout.events_stream, layout.events_filter(NODE_KIND))
            return {(m.headers or {}).get("Nats-Subject", "") for m in msgs}

        assert await eventually(nodes, timeout=20, what="n2 registered") == {
            layout.aggregate_subject(aggregate_id(NODE_KIND, "", "n2"))}
    finally:
        await vb.close()


async def test_a_report_about_a_vmi_counts_only_from_its_node(
        open_install: Installation) -> None:
    """`n2` reporting `alice-vm` (on `n1`) gone (finding 3): refused, the VMI runs on."""
    writer = open_install.writer
    for node in ("n1", "n2"):
        register = report_command(NodeReport(id=node, node=node, kind="node",
                                             info=node_info(node)))
        assert register is not None
        await writer.execute(register)
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "alice-vm", "namespace": "default"},
           "spec": {"domain": {"devices": {},
                               "resources": {"requests": {"memory": "64Mi"}}}}}
    created = await writer.execute(Command(
        id=str(uuid.uuid4()), actor="alice", kind="VirtualMachineInstance", verb="apply",
        namespace="default", name="alice-vm", manifest=vmi))
    assert created.outcome.accepted, created.outcome.reason
    uid = str(created.events[0][1].uid)  # type: ignore[attr-defined]
    placed = await writer.execute(Command(
        id=str(uuid.uuid4()), actor="system:controller:scheduler",
        kind="VirtualMachineInstance", verb="schedule", namespace="default", name="alice-vm",
        manifest={"node": "n1"}))
    assert placed.outcome.accepted, placed.outcome.reason

    def gone(node: str) -> Command | None:
        return report_command(NodeReport(
            id=str(uuid.uuid4()), node=node, kind="domain",
            domain=DomainObservation(namespace="default", name="alice-vm", uid=uid,
                                     gone=True, phase="Failed")))

    forged = gone("n2")
    assert forged is not None
    refused = await writer.execute(forged)
    assert (refused.outcome.accepted, refused.outcome.field) == (False, "node")
    assert "runs on node 'n1'" in refused.outcome.reason
    honest = gone("n1")
    assert honest is not None
    accepted = await writer.execute(honest)
    assert accepted.outcome.accepted and accepted.events, "its own node is believed"


async def test_the_policy_decides_each_verb_in_each_namespace(
        secured_install: Installation) -> None:
    alice = await secured_install.client("alice")
    bob = await secured_install.client("bob")
    try:
        manifest = vm_manifest("web", "Halted")
        [applied] = await alice.apply({**manifest, "metadata": {"name": "web",
                                                                "namespace": "tenant-a"}})
        assert applied.accepted
        elsewhere = await alice.run(alice.command(
            "VirtualMachine", "apply", "tenant-b", "web",
            manifest={**manifest, "metadata": {"name": "web", "namespace": "tenant-b"}}),
            check=False)
        assert not elsewhere.accepted
        assert elsewhere.reason == (
            "forbidden: User 'alice' cannot patch resource \"virtualmachines\" in API group "
            "\"kubevirt.io\" in the namespace \"tenant-b\"")
        started = await bob.run(bob.command("VirtualMachine", "start", "tenant-a", "web"),
                                check=False)
        assert started.accepted, started.reason
        deleted = await bob.run(bob.command("VirtualMachine", "delete", "tenant-a", "web"),
                                check=False)
        assert not deleted.accepted and deleted.reason.startswith(
            "forbidden: User 'bob' cannot delete resource \"virtualmachines\"")
        nobody = await secured_install.client("mallory")
        try:
            stopped = await nobody.run(nobody.command("VirtualMachine", "stop", "tenant-a",
                                                      "web"), check=False)
            assert not stopped.accepted and stopped.reason.startswith("forbidden")
        finally:
            await nobody.close()
    finally:
        await asyncio.gather(alice.close(), bob.close())


async def test_a_node_report_without_its_fields_is_refused_and_changes_nothing(
        open_install: Installation) -> None:
    """Finding 9: a `Node register` without `nodeName` used to raise an uncaught error, on
    every restart; now it is a refusal naming the field."""
    command = report_command(NodeReport(id=str(uuid.uuid4()), node="n1", kind="node",
                                        info={"capacity": {"cpu": "8"}}))
    assert command is not None
    result = await open_install.writer.execute(command)
    assert not result.outcome.accepted
    assert "nodeName" in f"{result.outcome.field} {result.outcome.reason}", result.outcome
    assert result.events == []


NAMESPACE_ADMIN = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: everything, namespace: tenant-c}
rules: [{apiGroups: ["*"], resources: ["*"], verbs: ["*"]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: carol-everything, namespace: tenant-c}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: everything}
subjects: [{kind: User, name: carol}]
"""


@pytest.mark.parametrize(("kind", "verb", "manifest"), [
    ("Node", "cordon", {}),
    ("Node", "drain", {}),
    ("Node", "taint", {"taints": [{"key": "k", "effect": "NoExecute"}]}),
    ("HyperConverged", "apply", {"apiVersion": "hco.kubevirt.io/v1beta1",
                                 "kind": "HyperConverged",
                                 "metadata": {"name": "kubevirt-hyperconverged",
                                              "namespace": "tenant-c"}, "spec": {}}),
    ("HyperConverged", "delete", {}),
])
async def test_a_grant_in_one_namespace_does_not_reach_the_clusters_objects(
        nats_url: str, prefix: str, kind: str, verb: str, manifest: object) -> None:
    """carol may do everything in tenant-c (a namespace admin's Role). A node, the
    HyperConverged and its operands are the cluster's, one of each: as in Kubernetes, no
    Role reaches them, whatever namespace her command names. (Decided in tenant-c, she
    cordoned, tainted and drained nodes, and with the HyperConverged's `RemoveWorkloads`
    could delete every VM of every namespace.)"""
    policy = parse_policy(NAMESPACE_ADMIN, "carol's policy")
    async for installation in _installation(nats_url, prefix, policy):
        carol = await installation.client("carol")
        try:
            name = "kubevirt-hyperconverged" if kind == "HyperConverged" else "n1"
            outcome = await carol.run(carol.command(kind, verb, "tenant-c", name,
                                                    manifest=manifest), check=False)
            assert not outcome.accepted
            assert outcome.reason.startswith("forbidden: User 'carol'")
            assert outcome.reason.endswith("at the cluster scope"), outcome.reason
            [own] = await carol.apply({**vm_manifest("web", "Halted"),
                                       "metadata": {"name": "web", "namespace": "tenant-c"}})
            assert own.accepted, "her own namespace is hers"
        finally:
            await carol.close()
