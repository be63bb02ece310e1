"""VirtualMachineInstancePresets on the real store: applied when a VMI is created (a
standalone VMI, a VM's, a replica set's) to the VMIs their selector matches, as KubeVirt's
preset mutator did: unset fields filled, applied presets annotated, a field the VMI sets
differently left as the VMI has it and the conflict recorded on the VMI, presets that
disagree with each other refusing the VMI."""

from __future__ import annotations

import uuid
from typing import Any

from controlplane.vm.controller import VMController
from events.language.messages import Command
from events.language.query import Query
from projections.cluster import ClusterState
from projections.rendering import render
from tests.store.helpers import SyncHandler, run, run_accepted
from tests.store.test_feature_gates import appended_since, apply, last_sequence, stored_event
from tests.store.test_replicasets import RS, ReplicaCluster, replica_set

APPLIED = "virtualmachinepreset.kubevirt.io/"


def preset(name: str, domain: dict[str, Any], selector: dict[str, Any] | None = None,
           namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstancePreset",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": selector or {"matchLabels": {"kubevirt.io/size": "small"}},
                     "domain": domain}}


def vmi(name: str, domain: dict[str, Any] | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kubevirt.io/size": "small"} if labels is None else labels,
                         "annotations": annotations or {}},
            "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}},
                                **(domain or {})}}}


def shown(state: ClusterState, name: str) -> dict[str, Any]:
    [obj] = render(state, Query(kind="VirtualMachineInstance", namespace="default", name=name))
    return obj


SMALL = {"cpu": {"cores": 2}, "firmware": {"uuid": "6a1a24a1-4061-4607-8bf4-a3963d0c5895"}}


def test_a_preset_fills_what_the_vmi_leaves_unset_and_is_recorded(
        handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(preset("small", SMALL)))
    run_accepted(handler, state, apply(vmi("matched")))
    run_accepted(handler, state, apply(vmi("unlabelled", labels={})))
    run_accepted(handler, state, apply(vmi("excluded", annotations={
        "virtualmachineinstancepresets.admission.kubevirt.io/exclude": "true"})))
    run_accepted(handler, state, apply(preset("elsewhere", SMALL, namespace="other")))

    matched = shown(state, "matched")
    assert matched["spec"]["domain"]["cpu"] == {"cores": 2}
    assert matched["spec"]["domain"]["firmware"] == SMALL["firmware"]
    assert matched["metadata"]["annotations"] == {APPLIED + "small": "kubevirt.io/v1"}
    for name in ("unlabelled", "excluded"):
        obj = shown(state, name)
        assert "cpu" not in obj["spec"]["domain"]
        assert not any(k.startswith(APPLIED) for k in obj["metadata"].get("annotations", {}))
    # The same manifest applied again is the same VMI, presets and all.
    assert run(handler, state, apply(vmi("matched"))).events == []


def test_a_conflicting_preset_is_not_applied_and_the_vmi_says_so(
        handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(preset("small", {"cpu": {"cores": 2}})))
    before = last_sequence(handler)
    run_accepted(handler, state, apply(vmi("mine", {"cpu": {"cores": 4}})))
    obj = shown(state, "mine")
    assert obj["spec"]["domain"]["cpu"] == {"cores": 4}
    assert APPLIED + "small" not in obj["metadata"].get("annotations", {})
    assert appended_since(handler, before)[1:] == [
        "VirtualMachineInstanceCreated.v1", "VirtualMachineInstancePresetConflicted.v1"]
    conflict = stored_event(handler, last_sequence(handler))
    assert (conflict.preset, conflict.applied, conflict.message) == (  # type: ignore[attr-defined]
        "small", False, 'spec.cpu: {"cores":2} != {"cores":4}')

    # A preset with a conflicting field and a field it fills: applied, the conflict kept.
    run_accepted(handler, state, apply(preset("small", {
        "cpu": {"cores": 2}, "features": {"acpi": {}}})))
    run_accepted(handler, state, apply(vmi("partly", {"cpu": {"cores": 4}})))
    obj = shown(state, "partly")
    assert obj["spec"]["domain"]["cpu"] == {"cores": 4}
    assert obj["spec"]["domain"]["features"] == {"acpi": {}}
    assert APPLIED + "small" in obj["metadata"]["annotations"]
    conflict = stored_event(handler, last_sequence(handler))
    assert conflict.applied  # type: ignore[attr-defined]


def test_presets_that_disagree_refuse_the_vmi(handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(preset("a", {"cpu": {"cores": 2}})))
    run_accepted(handler, state, apply(preset("b", {"cpu": {"cores": 3}})))
    before = last_sequence(handler)
    outcome = run(handler, state, apply(vmi("refused"))).outcome
    assert (outcome.accepted, outcome.field) == (False, "metadata.labels")
    assert outcome.reason == ("VirtualMachinePresets cannot be applied due to conflicts: "
                              "presets 'b' and 'a' conflict: "
                              'spec.cpu: {"cores":3} != {"cores":2}')
    assert appended_since(handler, before) == ["CommandRejected.v1"]


def test_a_vms_vmi_takes_the_presets(handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(preset("small", {"cpu": {"cores": 2}})))
    manifest = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": "vm1", "namespace": "default"},
                "spec": {"runStrategy": "Always", "template": {
                    "metadata": {"labels": {"kubevirt.io/size": "small"}},
                    "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}}}}
    run_accepted(handler, state, apply(manifest))
    for command in VMController().reconcile(state, "default", "vm1"):
        run_accepted(handler, state, command)
    obj = shown(state, "vm1")
    assert obj["spec"]["domain"]["cpu"] == {"cores": 2}
    assert obj["metadata"]["annotations"][APPLIED + "small"] == "kubevirt.io/v1"


def test_a_vm_refused_for_its_presets_starts_once_they_agree(handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(preset("a", {"cpu": {"cores": 2}})))
    run_accepted(handler, state, apply(preset("b", {"cpu": {"cores": 3}})))
    manifest = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": "vm1", "namespace": "default"},
                "spec": {"runStrategy": "Always", "template": {
                    "metadata": {"labels": {"kubevirt.io/size": "small"}},
                    "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}}}}
    run_accepted(handler, state, apply(manifest))
    [create] = VMController().reconcile(state, "default", "vm1")
    assert not run(handler, state, create).outcome.accepted
    assert state.vmi("default", "vm1") is None
    run_accepted(handler, state, Command(
        id=str(uuid.uuid4()), actor="user:erin", kind="VirtualMachineInstancePreset",
        verb="delete", namespace="default", name="b"))
    [again] = VMController().reconcile(state, "default", "vm1")
    assert again.id != create.id
    run_accepted(handler, state, again)
    assert shown(state, "vm1")["spec"]["domain"]["cpu"] == {"cores": 2}


def test_a_refused_replica_is_the_replica_sets_failure_until_one_is_created(
        handler: SyncHandler, prefix: str) -> None:
    c = ReplicaCluster(handler, prefix)
    selector = {"matchLabels": {"kubevirt.io/vmReplicaSet": "web"}}
    c.run(apply(preset("a", {"cpu": {"cores": 2}}, selector)))
    c.run(apply(preset("b", {"cpu": {"cores": 3}}, selector)))
    c.run(apply(replica_set(1)))
    c.settle()
    assert c.replicas() == []
    [condition] = c.status()["conditions"]
    assert (condition["type"], condition["reason"]) == ("ReplicaFailure", "FailedCreate")
    assert condition["message"].startswith("VirtualMachinePresets cannot be applied")

    c.run(Command(id=str(uuid.uuid4()), actor="user:erin",
                  kind="VirtualMachineInstancePreset", verb="delete", namespace="default",
                  name="b"))
    c.settle()
    [replica] = c.replicas()
    assert replica.spec is not None and replica.spec.domain.cpu is not None
    assert replica.spec.domain.cpu.cores == 2
    assert "conditions" not in c.status()
    [rs] = render(c.state, Query(kind=RS, namespace="default", name="web"))
    assert rs["status"]["replicas"] == 1
