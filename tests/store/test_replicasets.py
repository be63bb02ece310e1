"""VirtualMachineInstanceReplicaSets on the real store, through commands and the replica set
controller: scaled up and down (the VMIs not running yet go first), never more replicas than
asked however often and on however stale a state the controller decides, a replica lost to a
node failure replaced once, `paused` stopping it, and the status KubeVirt shows."""

from __future__ import annotations

import json
import uuid
from typing import Any

import msgspec

from controlplane.replicaset.controller import ReplicaSetController
from events.authorization.policy import Request, command_request
from events.language.kinds.vm import NODE_UNRESPONSIVE
from events.language.messages import Command, DomainObservation, node_actor
from events.language.query import Query
from events.language.subjects import Layout
from projections.cluster import ClusterState
from projections.http import respond
from projections.kinds.vm import VirtualMachineInstanceView
from projections.rendering import render
from tests.store.helpers import SyncHandler, replayed, run, run_accepted
from tests.store.scheduling_helpers import Cluster
from tests.store.test_feature_gates import apply

RS = "VirtualMachineInstanceReplicaSet"
LABELS = {"kubevirt.io/vmReplicaSet": "web"}


def replica_set(replicas: int | None = 3, *, paused: bool = False,
                annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """KubeVirt's `examples/vmi-replicaset-cirros.yaml`, named `web`."""
    spec: dict[str, Any] = {
        "selector": {"matchLabels": LABELS},
        "template": {"metadata": {"labels": LABELS}, "spec": {
            "domain": {"devices": {"disks": [{"name": "containerdisk",
                                              "disk": {"bus": "virtio"}}]},
                       "resources": {"requests": {"memory": "128Mi"}}},
            "terminationGracePeriodSeconds": 0,
            "volumes": [{"name": "containerdisk",
                         "containerDisk": {"image": "kubevirt/cirros-container-disk-demo"}}]}}}
    if replicas is not None:
        spec["replicas"] = replicas
    if paused:
        spec["paused"] = True
    return {"apiVersion": "kubevirt.io/v1", "kind": RS,
            "metadata": {"name": "web", "namespace": "default",
                         "annotations": annotations or {}}, "spec": spec}


def user(verb: str, **body: Any) -> Command:
    return Command(id=str(uuid.uuid4()), actor="user:erin", kind=RS, verb=verb,
                   namespace="default", name="web", manifest=body or None)


class ReplicaCluster(Cluster):
    def __init__(self, handler: SyncHandler, prefix: str) -> None:
        super().__init__(handler)
        self.prefix = prefix
        self.controller = ReplicaSetController()

    def settle(self, state: ClusterState | None = None) -> list[Command]:
        """The replica set controller's passes on `state` (the cluster's own by default),
        each command executed and folded, until a pass proposes nothing new."""
        state = state or self.state
        seen: set[str] = set()
        ran: list[Command] = []
        while fresh := [c for c in self.controller.resync(state) if c.id not in seen]:
            for command in fresh:
                seen.add(command.id)
                ran.append(command)
                run(self.handler, state, command)
        return ran

    def replicas(self, state: ClusterState | None = None) -> list[VirtualMachineInstanceView]:
        """The active replicas of `web` (not final, not being deleted)."""
        return (state or self.state).replicas("default", "web")

    def running(self, name: str) -> None:
        """The VMI's node reports it Running."""
        view = self.state.vmi("default", name)
        assert view is not None and view.node
        self.run(Command(id=str(uuid.uuid4()), actor=node_actor(view.node),
                         kind="VirtualMachineInstance", verb="observe", namespace="default",
                         name=name, manifest=msgspec.to_builtins(DomainObservation(
                             namespace="default", name=name, uid=view.uid, phase="Running"))))

    def status(self) -> dict[str, Any]:
        [rs] = render(self.state, Query(kind=RS, namespace="default", name="web"))
        status: dict[str, Any] = rs["status"]
        return status


def cluster(handler: SyncHandler, prefix: str) -> ReplicaCluster:
    c = ReplicaCluster(handler, prefix)
    c.node("n1")
    c.node("n2")
    return c


def test_scaled_up_and_down_with_kubevirts_names_owner_and_status(
        handler: SyncHandler, prefix: str) -> None:
    c = cluster(handler, prefix)
    c.run(apply(replica_set(3)))
    assert [cmd.verb for cmd in c.settle()] == ["create-replica"] * 3
    names = sorted(v.metadata.name for v in c.replicas())
    assert len(names) == 3
    for name in names:
        assert name.startswith("web") and len(name) == len("web") + 5
        [vmi] = render(c.state, Query(kind="VirtualMachineInstance", namespace="default",
                                      name=name))
        assert vmi["metadata"]["labels"] == LABELS
        assert vmi["metadata"]["ownerReferences"] == [{
            "apiVersion": "kubevirt.io/v1", "name": "web", "kind": RS, "controller": True,
            "blockOwnerDeletion": True}]
    assert c.status() == {"labelSelector": "kubevirt.io/vmReplicaSet=web", "replicas": 3}

    c.schedule()
    running = names[:2]
    for name in running:
        c.running(name)
    assert c.status()["readyReplicas"] == 2

    # Scaled to 1: the replica not running yet goes first, then the newest running one.
    run_accepted(handler, c.state, user("scale", replicas=1))
    verbs = [(cmd.verb, (cmd.manifest or {}).get("name")) for cmd in c.settle()]
    assert verbs[0] == ("delete-replica", names[2])
    assert len(verbs) == 2 and verbs[1][0] == "delete-replica"
    assert len(c.replicas()) == 1
    [rs] = render(c.state, Query(kind=RS, namespace="default", name="web"))
    assert rs["spec"]["replicas"] == 1 and rs["metadata"]["generation"] == 2

    # Scaled up again: new names, one VMI each.
    run_accepted(handler, c.state, user("scale", replicas=2))
    c.settle()
    assert len(c.replicas()) == 2


def test_never_more_replicas_than_asked_when_decided_twice_or_after_a_restart(
        handler: SyncHandler, prefix: str) -> None:
    """A leader and its stale successor decide on states that do not see each other's
    replicas; the handler counts on the log and refuses what would be one too many."""
    c = cluster(handler, prefix)
    c.run(apply(replica_set(2)))
    stale = replayed(handler, Layout(prefix))
    first = c.settle()
    assert len(first) == 2 and len(c.replicas()) == 2

    # The same decision again (a redelivery, a restart before the fold): the same ids, and
    # their first outcome; no VMI more.
    again = c.controller.resync(stale)
    assert [cmd.id for cmd in again] == [cmd.id for cmd in first]
    assert [run(handler, stale, cmd).outcome.accepted for cmd in again] == [True, True]

    # The stale state moves on elsewhere (the replica set annotated): new ids, refused.
    run_accepted(handler, stale, apply(replica_set(2, annotations={"note": "edited"})))
    proposed = c.controller.resync(stale)
    assert [cmd.verb for cmd in proposed] == ["create-replica"] * 2
    assert not {cmd.id for cmd in proposed} & {cmd.id for cmd in first}
    outcomes = [run(handler, stale, cmd).outcome for cmd in proposed]
    assert [o.accepted for o in outcomes] == [False, False]
    assert outcomes[0].reason == "no longer needed: 2 of 2 replicas exist"

    restarted = replayed(handler, Layout(prefix))
    assert len(c.replicas(restarted)) == 2
    assert c.controller.resync(restarted) == []


def test_a_replica_lost_to_a_node_failure_is_replaced_once(
        handler: SyncHandler, prefix: str) -> None:
    c = cluster(handler, prefix)
    c.run(apply(replica_set(2)))
    c.settle()
    c.schedule()
    for vmi in c.replicas():
        c.running(vmi.metadata.name)
    lost = c.replicas()[0]
    # The node lifecycle controller's verdict on a VMI of a node gone silent.
    c.run(Command(id=str(uuid.uuid4()), actor="system:controller:nodelifecycle",
                  kind="VirtualMachineInstance", verb="fail", namespace="default",
                  name=lost.metadata.name, manifest={"reason": NODE_UNRESPONSIVE}))
    stale = replayed(handler, Layout(prefix))
    ran = sorted((cmd.kind, cmd.verb) for cmd in c.settle())
    assert ran == [("VirtualMachineInstance", "delete"), (RS, "create-replica")]
    replacement = {v.metadata.name for v in c.replicas()} - {lost.metadata.name}
    assert len(c.replicas()) == 2 and len(replacement) == 2
    assert c.state.vmi("default", lost.metadata.name) is None

    # A successor that saw the failure, not the replacement, and has moved on: refused.
    run_accepted(handler, stale, apply(replica_set(2, annotations={"note": "edited"})))
    for cmd in c.controller.resync(stale):
        run(handler, stale, cmd)
    assert len(c.replicas(replayed(handler, Layout(prefix)))) == 2


def test_paused_stops_reconciling_and_says_so(handler: SyncHandler, prefix: str) -> None:
    c = cluster(handler, prefix)
    c.run(apply(replica_set(2, paused=True)))
    assert c.settle() == []
    [condition] = c.status()["conditions"]
    assert {k: condition[k] for k in ("type", "status", "reason", "message")} == {
        "type": "ReplicaPaused", "status": "True", "reason": "Paused",
        "message": "Controller got paused"}
    # Even a replica the controller proposed before the pause is refused now.
    c.run(apply(replica_set(2)))
    proposed = c.controller.resync(c.state)
    c.run(apply(replica_set(2, paused=True)))
    assert [run(handler, c.state, cmd).outcome.reason for cmd in proposed] == [
        "the replica set is paused"] * 2
    c.run(apply(replica_set(2)))
    c.settle()
    assert len(c.replicas()) == 2 and "conditions" not in c.status()


def test_finished_replicas_are_deleted_and_replaced_and_deletion_takes_the_vmis(
        handler: SyncHandler, prefix: str) -> None:
    c = cluster(handler, prefix)
    c.run(apply(replica_set(None)))  # KubeVirt's default: one
    c.settle()
    [first] = c.replicas()
    c.schedule()
    c.running(first.metadata.name)
    node = first.node
    c.run(Command(id=str(uuid.uuid4()), actor=node_actor(node), kind="VirtualMachineInstance",
                  verb="observe", namespace="default", name=first.metadata.name,
                  manifest=msgspec.to_builtins(DomainObservation(
                      namespace="default", name=first.metadata.name, uid=first.uid,
                      phase="Succeeded", gone=True))))
    c.settle()
    [second] = c.replicas()
    assert second.metadata.name != first.metadata.name
    assert c.state.vmi("default", first.metadata.name) is None

    run_accepted(handler, c.state, user("delete"))
    assert c.state.replica_set("default", "web") is None
    assert c.state.vmi("default", second.metadata.name) is None


def stray(labels: dict[str, str]) -> dict[str, Any]:
    """A VMI of the replica set's template, made by hand (no controller owns it)."""
    template = replica_set()["spec"]["template"]
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "stray", "namespace": "default", "labels": labels},
            "spec": template["spec"]}


def owner_of(c: ReplicaCluster, name: str) -> list[dict[str, Any]] | None:
    [vmi] = render(c.state, Query(kind="VirtualMachineInstance", namespace="default",
                                  name=name))
    owners: list[dict[str, Any]] | None = vmi["metadata"].get("ownerReferences")
    return owners


def test_an_orphan_the_selector_matches_is_adopted_and_a_relabeled_replica_released(
        handler: SyncHandler, prefix: str) -> None:
    """KubeVirt's `ClaimVirtualMachineInstances`: an orphan whose labels match is adopted
    and counted before the replica set scales; a replica whose labels stop matching is
    released, no longer counted, and replaced."""
    c = cluster(handler, prefix)
    c.run(apply(stray(LABELS)))
    c.run(apply(replica_set(2)))
    verbs = [(cmd.verb, (cmd.manifest or {}).get("name")) for cmd in c.settle()]
    assert verbs[0] == ("adopt", "stray")
    assert [verb for verb, _ in verbs[1:]] == ["create-replica"]  # one: stray counts
    assert owner_of(c, "stray") == [{"apiVersion": "kubevirt.io/v1", "name": "web", "kind": RS,
                                     "controller": True, "blockOwnerDeletion": True}]
    assert "stray" in {v.metadata.name for v in c.replicas()}
    assert c.status()["replicas"] == 2

    c.run(apply(stray({"app": "elsewhere"})))  # `kubectl label`: the spec as it was
    verbs = [(cmd.verb, (cmd.manifest or {}).get("name")) for cmd in c.settle()]
    assert verbs[0] == ("release", "stray")
    assert [verb for verb, _ in verbs[1:]] == ["create-replica"]
    assert owner_of(c, "stray") is None
    assert "stray" not in {v.metadata.name for v in c.replicas()}
    assert len(c.replicas()) == 2 and c.state.vmi("default", "stray") is not None

    # Matching again, it is adopted again, and one replica too many is scaled away.
    c.run(apply(stray(LABELS)))
    verbs = [cmd.verb for cmd in c.settle()]
    assert verbs == ["adopt", "delete-replica"]
    assert len(c.replicas()) == 2


def test_adoption_and_release_are_decided_again_on_the_log(
        handler: SyncHandler, prefix: str) -> None:
    """A claim proposed on a stale state is refused once the VMI has a controller, is being
    deleted, or no longer matches."""
    c = cluster(handler, prefix)
    c.run(apply(stray(LABELS)))
    c.run(apply(replica_set(0)))
    [adopt] = [cmd for cmd in c.controller.resync(c.state) if cmd.verb == "adopt"]
    c.run(apply(stray({"app": "elsewhere"})))
    outcome = run(handler, c.state, adopt).outcome
    assert (outcome.accepted, outcome.field, outcome.reason) == (
        False, "manifest.name", "the selector does not match stray's labels")
    assert c.controller.resync(c.state) == []
    assert owner_of(c, "stray") is None

    c.run(apply(stray(LABELS)))
    [adopt] = [cmd for cmd in c.controller.resync(c.state) if cmd.verb == "adopt"]
    run_accepted(handler, c.state, adopt)
    again = run(handler, c.state, msgspec.structs.replace(adopt, id=str(uuid.uuid4())))
    assert again.outcome.reason == "stray has a controller already"
    release = Command(id=str(uuid.uuid4()), actor="system:controller:replicaset", kind=RS,
                      verb="release", namespace="default", name="web",
                      manifest={"name": "stray"})
    assert run(handler, c.state, release).outcome.reason == \
        "the selector still matches stray's labels"


def test_bad_input_names_the_field_and_changes_nothing(
        handler: SyncHandler, prefix: str) -> None:
    c = cluster(handler, prefix)
    mismatched = replica_set(1)
    mismatched["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    outcome = run(handler, c.state, apply(mismatched)).outcome
    assert (outcome.accepted, outcome.field, outcome.reason) == (
        False, "spec.selector", "selector does not match labels.")
    negative = replica_set(1)
    negative["spec"]["replicas"] = -1
    assert run(handler, c.state, apply(negative)).outcome.field == "spec.replicas"
    c.run(apply(replica_set(1)))
    for body in ({"replicas": -2}, {"replicas": "many"}, {}):
        outcome = run(handler, c.state, user("scale", **body)).outcome
        assert (outcome.accepted, outcome.field) == (False, "spec.replicas")
    assert c.state.replica_set("default", "web").spec.wanted == 1  # type: ignore[union-attr]


def test_read_over_http_and_scaled_under_the_roles_that_patch_it(
        handler: SyncHandler, prefix: str) -> None:
    c = cluster(handler, prefix)
    c.run(apply(replica_set(1)))
    status, _, body = respond(c.state, render, "/apis/kubevirt.io/v1/namespaces/default/"
                                               "virtualmachineinstancereplicasets/web")
    assert status == 200 and json.loads(body)["kind"] == RS
    assert command_request(RS, "scale", "default") == Request(
        "patch", "kubevirt.io", "virtualmachineinstancereplicasets", "default")
