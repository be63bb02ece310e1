"""Instancetypes and preferences on the real store, through commands and the VM controller:
what an instancetype fixes the VM may not set (refused at apply, naming the fields as KubeVirt
does), a preference fills only what the VM leaves unset, and the revisions captured at the
first start pin the VM through edits and deletion of the instancetype until it is moved on."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from controlplane.vm.controller import VMController
from events.authorization.policy import command_request, parse_policy
from events.language.messages import Command
from events.language.query import Query
from projections.cluster import ClusterState
from projections.http import respond
from projections.rendering import render, render_view
from tests.store.helpers import SyncHandler, run, run_accepted
from tests.store.test_feature_gates import appended_since, apply, last_sequence, stored_event

GROUP = "instancetype.kubevirt.io"
DISKS = [{"name": "containerdisk", "disk": {"bus": "sata"}},
         {"name": "cloudinitdisk", "disk": {}}]
VOLUMES = [{"name": "containerdisk", "containerDisk": {"image": "cirros"}},
           {"name": "cloudinitdisk", "cloudInitNoCloud": {"userData": "#!/bin/sh"}}]


def instancetype(name: str, cpu: int, memory: str, *, kind: str = "VirtualMachineInstancetype",
                 version: str = "v1alpha2") -> dict[str, Any]:
    meta = {"name": name} if "Cluster" in kind else {"name": name, "namespace": "default"}
    return {"apiVersion": f"{GROUP}/{version}", "kind": kind, "metadata": meta,
            "spec": {"cpu": {"guest": cpu}, "memory": {"guest": memory}}}


def preference(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1beta1", "kind": "VirtualMachinePreference",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def vm(name: str, domain: dict[str, Any] | None = None, **matchers: dict[str, Any]
       ) -> dict[str, Any]:
    spec = {"domain": {"devices": {"disks": DISKS}, **(domain or {})}, "volumes": VOLUMES}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"runStrategy": "Always", **matchers, "template": {"spec": spec}}}


def command(kind: str, verb: str, name: str, namespace: str = "default") -> Command:
    return Command(id=str(uuid.uuid4()), actor="user:erin", kind=kind, verb=verb,
                   namespace=namespace, name=name)


def reconcile(handler: SyncHandler, state: ClusterState, name: str) -> list[str]:
    """Run the VM controller for `name` until it proposes nothing new; the verbs it ran.
    Its VMIs are never scheduled, so a delete takes effect at once."""
    ran: list[str] = []
    seen: set[str] = set()
    while commands := [c for c in VMController().reconcile(state, "default", name)
                       if c.id not in seen]:
        for proposed in commands:
            seen.add(proposed.id)
            ran.append(proposed.verb)
            run(handler, state, proposed)
    return ran


def restart(handler: SyncHandler, state: ClusterState, name: str) -> None:
    run_accepted(handler, state, command("VirtualMachine", "restart", name))
    assert reconcile(handler, state, name) == ["delete", "create-for-vm"]


def vmi_spec(state: ClusterState, name: str) -> dict[str, Any]:
    view = state.vmi("default", name)
    assert view is not None
    rendered = render_view(state, view)
    assert rendered is not None
    spec: dict[str, Any] = rendered["spec"]
    return spec


def get(state: ClusterState, kind: str, name: str, namespace: str = "default") -> dict[str, Any]:
    [obj] = render(state, Query(kind=kind, namespace=namespace, name=name))
    return obj


def test_the_seeds_example_expands_into_the_vmi(handler: SyncHandler) -> None:
    """The seed's `example-preference-user-override`, with `csmall` for its resources: the
    VM names no memory (refused before instancetypes), its `sata` disk stays `sata` and the
    bare disk takes the preferred `virtio`; the first start captures and pins revisions."""
    state = ClusterState()
    run_accepted(handler, state, apply(instancetype("csmall", 1, "128Mi")))
    run_accepted(handler, state, apply(preference("example-preference-disk-virtio",
                                                  {"devices": {"preferredDiskBus": "virtio"}})))
    manifest = vm("example-preference-user-override",
                  instancetype={"kind": "VirtualMachineInstancetype", "name": "csmall"},
                  preference={"kind": "VirtualMachinePreference",
                              "name": "example-preference-disk-virtio"})
    run_accepted(handler, state, apply(manifest))
    assert reconcile(handler, state, "example-preference-user-override") == ["create-for-vm"]

    spec = vmi_spec(state, "example-preference-user-override")
    assert spec["domain"]["memory"] == {"guest": "128Mi"}
    assert spec["domain"]["cpu"] == {"cores": 1, "sockets": 1, "threads": 1}
    assert spec["domain"]["devices"]["disks"] == [
        {"name": "containerdisk", "disk": {"bus": "sata"}},
        {"name": "cloudinitdisk", "disk": {"bus": "virtio"}}]
    vmi = get(state, "VirtualMachineInstance", "example-preference-user-override")
    assert vmi["metadata"]["annotations"] == {
        "kubevirt.io/instancetype-name": "csmall",
        "kubevirt.io/preference-name": "example-preference-disk-virtio"}

    shown = get(state, "VirtualMachine", "example-preference-user-override")
    # The VM's own template is as the user wrote it; the matchers now name the revisions.
    assert shown["spec"]["template"]["spec"]["domain"]["devices"]["disks"] == DISKS
    source = get(state, "VirtualMachineInstancetype", "csmall")
    revision = f"example-preference-user-override-csmall-{source['metadata']['uid']}-1"
    assert shown["spec"]["instancetype"] == {"name": "csmall", "kind":
                                             "VirtualMachineInstancetype",
                                             "revisionName": revision}
    assert shown["status"]["instancetypeRef"] == {
        "kind": "VirtualMachineInstancetype", "name": "csmall",
        "controllerRevisionRef": {"name": revision}}
    assert shown["status"]["preferenceRef"]["controllerRevisionRef"]["name"].startswith(
        "example-preference-user-override-example-preference-disk-virtio-")
    assert shown["metadata"]["generation"] == 2  # the matchers changed: a spec change
    captured = get(state, "ControllerRevision", revision)
    assert captured["data"] == {
        "apiVersion": f"{GROUP}/v1alpha2", "kind": "VirtualMachineInstancetype",
        "metadata": {"name": "csmall", "namespace": "default",
                     "uid": source["metadata"]["uid"], "generation": 1},
        "spec": {"cpu": {"guest": 1}, "memory": {"guest": "128Mi"}}}
    assert captured["metadata"]["ownerReferences"][0]["name"] == \
        "example-preference-user-override"


def test_what_the_instancetype_fixes_cannot_be_set_on_the_vm(handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(instancetype("cx1.large", 2, "4Gi",
                                                    kind="VirtualMachineClusterInstancetype",
                                                    version="v1beta1")))
    before = last_sequence(handler)
    conflicting = vm("greedy", {"cpu": {"sockets": 4}, "memory": {"guest": "8Gi"}},
                     instancetype={"name": "cx1.large"})  # no kind: the cluster kind
    refused = run(handler, state, apply(conflicting)).outcome
    assert (refused.accepted, refused.field) == (False, "spec.template.spec.domain.cpu.sockets")
    assert refused.reason == (
        "VM field(s) spec.template.spec.domain.cpu.sockets, "
        "spec.template.spec.domain.memory.guest conflicts with selected instance type")
    requests = vm("asks", {"resources": {"requests": {"memory": "1Gi"}}},
                  instancetype={"name": "cx1.large"})
    refused = run(handler, state, apply(requests)).outcome
    assert refused.reason == ("VM field(s) spec.template.spec.domain.resources.requests.memory "
                              "conflicts with selected instance type")
    assert appended_since(handler, before) == ["CommandRejected.v1"] * 2
    assert state.vm("default", "greedy") is None


def test_a_preference_fills_only_what_the_vm_leaves_unset(handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(instancetype("u1.xlarge", 4, "16Gi")))
    run_accepted(handler, state, apply(preference("fedora", {
        "cpu": {"preferredCPUTopology": "cores"},
        "devices": {"preferredDiskBus": "scsi", "preferredInterfaceModel": "virtio"},
        "features": {"preferredSmm": {}},
        "firmware": {"preferredUseEfi": True, "preferredUseSecureBoot": False},
        "preferredTerminationGracePeriodSeconds": 30,
    })))
    own = vm("own", {"firmware": {"bootloader": {"bios": {}}}},
             instancetype={"kind": "virtualmachineinstancetype", "name": "u1.xlarge"},
             preference={"kind": "VirtualMachinePreference", "name": "fedora"})
    own["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 0
    run_accepted(handler, state, apply(own))
    reconcile(handler, state, "own")
    spec = vmi_spec(state, "own")
    assert spec["domain"]["cpu"] == {"cores": 4, "sockets": 1, "threads": 1}
    assert [d["disk"]["bus"] for d in spec["domain"]["devices"]["disks"]] == ["sata", "scsi"]
    assert spec["domain"]["firmware"] == {"bootloader": {"bios": {}}}  # no EFI over BIOS
    assert spec["domain"]["features"]["smm"] == {}
    assert spec["terminationGracePeriodSeconds"] == 0


def test_a_pinned_revision_survives_edits_and_deletion(handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(instancetype("csmall", 1, "128Mi")))
    manifest = vm("pinned", instancetype={"kind": "VirtualMachineInstancetype",
                                          "name": "csmall"})
    run_accepted(handler, state, apply(manifest))
    reconcile(handler, state, "pinned")
    first = get(state, "VirtualMachine", "pinned")["spec"]["instancetype"]["revisionName"]

    run_accepted(handler, state, apply(instancetype("csmall", 2, "256Mi")))
    assert get(state, "VirtualMachineInstancetype", "csmall")["metadata"]["generation"] == 2
    restart(handler, state, "pinned")
    assert vmi_spec(state, "pinned")["domain"]["memory"] == {"guest": "128Mi"}
    # Applying the manifest as written again (no revisionName) keeps the pin.
    run_accepted(handler, state, apply(manifest))
    assert get(state, "VirtualMachine", "pinned")["spec"]["instancetype"]["revisionName"] \
        == first
    renamed = {**manifest, "spec": {**manifest["spec"], "instancetype": {
        "kind": "VirtualMachineInstancetype", "name": "cmedium", "revisionName": first}}}
    refused = run(handler, state, apply(renamed)).outcome
    assert (refused.field, refused.reason) == (
        "spec.instancetype.revisionName",
        "the Matcher Name has been updated without updating the RevisionName")

    run_accepted(handler, state, command("VirtualMachineInstancetype", "delete", "csmall"))
    restart(handler, state, "pinned")
    assert vmi_spec(state, "pinned")["domain"]["memory"] == {"guest": "128Mi"}

    # Moving on: the instancetype again, and `revisionName: ""` to capture it anew.
    run_accepted(handler, state, apply(instancetype("csmall", 2, "256Mi")))
    manifest["spec"]["instancetype"]["revisionName"] = ""
    run_accepted(handler, state, apply(manifest))
    restart(handler, state, "pinned")
    spec = vmi_spec(state, "pinned")
    assert spec["domain"]["memory"] == {"guest": "256Mi"}
    assert spec["domain"]["cpu"]["sockets"] == 2
    second = get(state, "VirtualMachine", "pinned")["spec"]["instancetype"]["revisionName"]
    assert second not in (first, "")

    # The VM's revisions go with it.
    run_accepted(handler, state, command("VirtualMachine", "delete", "pinned"))
    assert render(state, Query(kind="ControllerRevision")) == []


def test_a_vm_waits_for_what_it_names(handler: SyncHandler) -> None:
    """KubeVirt admits a VM whose instancetype or preference is missing, judging its template
    as it stands, and does not start it; the object's creation wakes the controller with a
    new command."""
    state = ClusterState()
    early = vm("early", instancetype={"kind": "VirtualMachineInstancetype", "name": "later"})
    refused = run(handler, state, apply(early)).outcome
    assert (refused.accepted, refused.field) == (
        False, "spec.template.spec.domain.resources.requests.memory")
    sized = vm("early", {"memory": {"guest": "64Mi"}},
               preference={"kind": "VirtualMachinePreference", "name": "later"})
    run_accepted(handler, state, apply(sized))
    [create] = VMController().reconcile(state, "default", "early")
    not_found = run(handler, state, create).outcome
    assert (not_found.accepted, not_found.field) == (False, "spec.preference.name")
    assert not_found.reason == \
        'virtualmachinepreferences.instancetype.kubevirt.io "later" not found'
    created = run_accepted(handler, state, apply(preference(
        "later", {"devices": {"preferredDiskBus": "virtio"}})))
    [again] = VMController().on_event(state, stored_event(handler, created.events[0][0]))
    assert again.id != create.id
    run_accepted(handler, state, again)
    disks = vmi_spec(state, "early")["domain"]["devices"]["disks"]
    assert [d["disk"]["bus"] for d in disks] == ["sata", "virtio"]


@pytest.mark.parametrize(("manifest", "field", "rule"), [
    (vm("odd", instancetype={"kind": "Flavor", "name": "x"}), "spec.instancetype.kind",
     "must be VirtualMachineInstancetype or VirtualMachineClusterInstancetype, not 'Flavor'"),
    (vm("nameless", instancetype={"kind": "VirtualMachineInstancetype"}),
     "spec.instancetype",
     "Either Name or InferFromVolume should be provided within the InstancetypeMatcher"),
    (vm("both", preference={"name": "x", "inferFromVolume": "containerdisk"}),
     "spec.preference.name", "Name already set, should be cleared before setting "
     "inferFromVolume"),
    (vm("policy", preference={"inferFromVolume": "containerdisk",
                              "inferFromVolumeFailurePolicy": "Shrug"}),
     "spec.preference.inferFromVolumeFailurePolicy",
     "Invalid value 'Shrug' for InferFromVolumeFailurePolicy"),
    (instancetype("Big", 1, "1Gi"), "metadata.name",
     "must be a DNS-1123 subdomain: at most 253 characters, DNS-1123 labels joined by '.'"),
    (instancetype("x", 1, "1Gi", version="v2"), "apiVersion",
     f"must be {GROUP}/v1beta1 or {GROUP}/v1alpha2 or {GROUP}/v1alpha1 for kind "
     "VirtualMachineInstancetype"),
    ({**instancetype("x", 1, "1Gi"), "spec": {"memory": {"guest": "1Gi"}}}, "spec",
     "Object missing required field `cpu`"),
])
def test_hostile_manifests_are_refused_naming_the_field(
        handler: SyncHandler, manifest: dict[str, Any], field: str, rule: str) -> None:
    before = last_sequence(handler)
    refused = run(handler, ClusterState(), apply(manifest)).outcome
    assert (refused.accepted, refused.field, refused.reason) == (False, field, rule)
    assert appended_since(handler, before) == ["CommandRejected.v1"]


def test_the_http_read_api_serves_the_four_kinds(handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(instancetype("csmall", 1, "128Mi")))
    run_accepted(handler, state, apply(instancetype("u1.nano", 1, "512Mi",
                                                    kind="VirtualMachineClusterInstancetype")))

    def get_json(path: str) -> tuple[int, dict[str, Any]]:
        code, _, body = respond(state, render, path)
        return code, json.loads(body)

    base = f"/apis/{GROUP}/v1beta1"
    code, listed = get_json(f"{base}/namespaces/default/virtualmachineinstancetypes")
    assert (code, listed["kind"], [i["metadata"]["name"] for i in listed["items"]]) == (
        200, "VirtualMachineInstancetypeList", ["csmall"])
    code, one = get_json(f"{base}/virtualmachineclusterinstancetypes/u1.nano")
    assert (code, one["spec"]["memory"]["guest"]) == (200, "512Mi")
    code, _ = get_json(f"{base}/namespaces/other/virtualmachineinstancetypes/csmall")
    assert code == 404
    assert respond(state, render, f"/apis/{GROUP}/v9/virtualmachineinstancetypes")[0] == 404


def test_a_preference_requires_enough_of_what_the_vm_gets(handler: SyncHandler) -> None:
    """common-instancetypes' cirros preference requires 1 vCPU and 256Mi."""
    state = ClusterState()
    run_accepted(handler, state, apply(preference("cirros", {"requirements": {
        "cpu": {"guest": 1}, "memory": {"guest": "256Mi"}}})))
    run_accepted(handler, state, apply(instancetype("csmall", 1, "128Mi")))
    cirros = {"kind": "VirtualMachinePreference", "name": "cirros"}
    short = vm("short", instancetype={"kind": "VirtualMachineInstancetype", "name": "csmall"},
               preference=cirros)
    refused = run(handler, state, apply(short)).outcome
    assert (refused.field, refused.reason) == (
        "spec.instancetype", "failure checking preference requirements: insufficient Memory "
        "resources of 128Mi provided by instance type, preference requires 256Mi")
    bare = vm("bare", {"memory": {"guest": "1Gi"}}, preference=cirros)
    refused = run(handler, state, apply(bare)).outcome
    assert (refused.field, refused.reason) == (
        "spec.template.spec.domain.cpu", "failure checking preference requirements: no CPU "
        "resources provided by VirtualMachine, preference requires 1 vCPU")
    enough = vm("enough", {"memory": {"guest": "1Gi"}, "cpu": {"sockets": 1}},
                preference=cirros)
    run_accepted(handler, state, apply(enough))


def test_nothing_can_be_inferred_from_a_volume(handler: SyncHandler) -> None:
    """virtbus keeps no PVC, DataVolume or DataSource to read KubeVirt's default-instancetype
    labels from: inference fails as KubeVirt's does for a missing object or a volume type
    without labels, and `Ignore` drops the matcher where KubeVirt lets it."""
    state = ClusterState()
    infer = {"inferFromVolume": "containerdisk"}
    refused = run(handler, state, apply(vm("guess", {"memory": {"guest": "1Gi"}},
                                           instancetype=infer))).outcome
    assert (refused.field, refused.reason) == (
        "spec.instancetype.inferFromVolume",
        "unable to infer defaults from volume containerdisk as type is not supported")
    ignored = vm("guess", {"memory": {"guest": "1Gi"}},
                 instancetype={**infer, "inferFromVolumeFailurePolicy": "Ignore"})
    run_accepted(handler, state, apply(ignored))
    assert "instancetype" not in get(state, "VirtualMachine", "guess")["spec"]
    missing = vm("missing", {"memory": {"guest": "1Gi"}},
                 preference={"inferFromVolume": "rootdisk",
                             "inferFromVolumeFailurePolicy": "Ignore"})
    refused = run(handler, state, apply(missing)).outcome
    assert (refused.field, refused.reason) == (
        "spec.preference.inferFromVolume", "unable to find volume rootdisk to infer defaults")


@pytest.mark.parametrize(("spec", "field", "rule"), [
    ({"cpu": {"guest": -1}, "memory": {"guest": "1Gi"}}, "spec.cpu.guest",
     "Expected `int` >= 0"),
    ({"cpu": {"guest": 1}, "memory": {"guest": "lots"}}, "spec.memory.guest",
     "must be a quantity such as 512Mi, 2Gi or 2"),
    ({"cpu": {"guest": 1}, "memory": {"guest": "1Gi", "overcommitPercent": 101}},
     "spec.memory.overcommitPercent",
     "spec.memory.overcommitPercent '101': must be in range between 0 and 100."),
    ({"cpu": {"guest": 1}, "memory": {"guest": "1Gi", "overcommitPercent": 10,
                                      "hugepages": {"pageSize": "2Mi"}}},
     "spec.memory.overcommitPercent", "spec.memory.overcommitPercent and "
     "spec.memory.hugepages should not be requested together."),
])
def test_kubevirts_instancetype_rules(handler: SyncHandler, spec: dict[str, Any], field: str,
                                      rule: str) -> None:
    refused = run(handler, ClusterState(),
                  apply({**instancetype("bad", 1, "1Gi"), "spec": spec})).outcome
    assert (refused.accepted, refused.field, refused.reason) == (False, field, rule)


@pytest.mark.parametrize(("cpu", "field", "rule"), [
    ({"preferredCPUTopology": "diagonal"}, "spec.cpu.preferredCPUTopology",
     "unknown preferredCPUTopology diagonal"),
    ({"preferredCPUTopology": "spread", "spreadOptions": {"across": "CoresThreads", "ratio": 4}},
     "spec.cpu.spreadOptions.ratio",
     "only a ratio of 2 (1 core 2 threads) is allowed when spreading vCPUs over cores and "
     "threads"),
    ({"spreadOptions": {"across": "Everywhere"}}, "spec.cpu.spreadOptions.across",
     "must be one of CoresThreads, SocketsCores, SocketsCoresThreads, not 'Everywhere'"),
    ({"spreadOptions": {"ratio": 0}}, "spec.cpu.spreadOptions.ratio", "Expected `int` >= 1"),
])
def test_kubevirts_preference_rules(handler: SyncHandler, cpu: dict[str, Any], field: str,
                                    rule: str) -> None:
    refused = run(handler, ClusterState(), apply(preference("bad", {"cpu": cpu}))).outcome
    assert (refused.accepted, refused.field, refused.reason) == (False, field, rule)


def test_a_spread_topology_divides_the_vcpus(handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(instancetype("odd", 3, "1Gi")))
    run_accepted(handler, state, apply(instancetype("even", 4, "1Gi")))
    run_accepted(handler, state, apply(preference("spread", {
        "cpu": {"preferredCPUTopology": "spread"}})))
    spread = {"kind": "VirtualMachinePreference", "name": "spread"}
    refused = run(handler, state, apply(vm("odd", preference=spread, instancetype={
        "kind": "VirtualMachineInstancetype", "name": "odd"}))).outcome
    assert (refused.field, refused.reason) == (
        "instancetype.spec.cpu.guest", "3 vCPUs provided by the instance type are not "
        "divisible by the Spec.PreferSpreadSocketToCoreRatio or "
        "Spec.CPU.PreferSpreadOptions.Ratio of 2 provided by the preference")
    run_accepted(handler, state, apply(vm("even", preference=spread, instancetype={
        "kind": "VirtualMachineInstancetype", "name": "even"})))
    reconcile(handler, state, "even")
    assert vmi_spec(state, "even")["domain"]["cpu"] == {"cores": 2, "sockets": 2, "threads": 1}


def test_a_cluster_kind_needs_a_cluster_wide_grant() -> None:
    """A RoleBinding grants in its namespace only: whatever namespace a manifest of a
    cluster-wide kind names, changing it is a request at the cluster scope."""
    policy = parse_policy("""
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: shapes}
rules:
- apiGroups: [instancetype.kubevirt.io]
  resources: [virtualmachineclusterinstancetypes, virtualmachineinstancetypes]
  verbs: ["*"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: shapes, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: shapes}
subjects: [{kind: User, name: erin}]
""")
    namespaced = instancetype("mine", 1, "1Gi")
    cluster = instancetype("u1.nano", 1, "512Mi", kind="VirtualMachineClusterInstancetype")
    cluster["metadata"]["namespace"] = "default"
    assert policy.allows("erin", command_request(namespaced["kind"], "apply", "", namespaced))
    assert not policy.allows("erin", command_request(cluster["kind"], "apply", "", cluster))
    assert not policy.allows("erin", command_request(cluster["kind"], "delete", "default"))


def test_the_vm_itself_takes_the_preferred_machine_and_storage(handler: SyncHandler) -> None:
    """KubeVirt's mutating webhook writes these into the stored VM, not only its VMIs."""
    state = ClusterState()
    run_accepted(handler, state, apply(preference("q35", {
        "machine": {"preferredMachineType": "pc-q35-rhel9.2.0"},
        "volumes": {"preferredStorageClassName": "fast"}})))
    manifest = vm("shaped", {"memory": {"guest": "1Gi"}},
                  preference={"kind": "VirtualMachinePreference", "name": "q35"})
    manifest["spec"]["dataVolumeTemplates"] = [
        {"metadata": {"name": "root"}, "spec": {"storage": {"resources": {}}}},
        {"metadata": {"name": "data"}, "spec": {"pvc": {"storageClassName": "slow"}}}]
    run_accepted(handler, state, apply(manifest))
    spec = get(state, "VirtualMachine", "shaped")["spec"]
    assert spec["template"]["spec"]["domain"]["machine"] == {"type": "pc-q35-rhel9.2.0"}
    assert [t["spec"] for t in spec["dataVolumeTemplates"]] == [
        {"storage": {"resources": {}, "storageClassName": "fast"}},
        {"pvc": {"storageClassName": "slow"}}]


def test_an_overcommitted_instancetype_asks_for_less_than_the_guest_gets(
        handler: SyncHandler) -> None:
    """common-instancetypes' o1.medium: 4Gi for the guest, half of it requested."""
    state = ClusterState()
    overcommitted = instancetype("o1.medium", 1, "4Gi", kind="VirtualMachineClusterInstancetype")
    overcommitted["spec"]["memory"]["overcommitPercent"] = 50
    run_accepted(handler, state, apply(overcommitted))
    run_accepted(handler, state, apply(vm("dense", instancetype={"name": "o1.medium"})))
    reconcile(handler, state, "dense")
    domain = vmi_spec(state, "dense")["domain"]
    assert (domain["memory"], domain["resources"]) == (
        {"guest": "4Gi"}, {"requests": {"memory": "2Gi"}})


def test_device_preferences_fill_the_tpm_video_and_dedicated_io_threads(
        handler: SyncHandler) -> None:
    """KubeVirt's `ApplyDevicePreferences`: a TPM and a video type where the VM has none, a
    dedicated I/O thread for each virtio disk that does not say (not for sata ones)."""
    state = ClusterState()
    run_accepted(handler, state, apply(preference("devices", {"devices": {
        "preferredTPM": {"persistent": True}, "preferredVideoType": "virtio",
        "preferredDiskDedicatedIoThread": True}})))
    disks = [{"name": "containerdisk", "disk": {"bus": "virtio"}},
             {"name": "cloudinitdisk", "disk": {}}]
    matcher = {"kind": "VirtualMachinePreference", "name": "devices"}
    run_accepted(handler, state, apply(vm("bare", {"memory": {"guest": "1Gi"}},
                                          preference=matcher)))
    run_accepted(handler, state, apply(vm("own", {
        "memory": {"guest": "1Gi"},
        "devices": {"disks": disks, "tpm": {"enabled": False}, "video": {"type": "vga"}}},
        preference=matcher)))
    for name in ("bare", "own"):
        assert reconcile(handler, state, name) == ["create-for-vm"]
    bare = vmi_spec(state, "bare")["domain"]["devices"]
    assert (bare["tpm"], bare["video"]) == ({"persistent": True}, {"type": "virtio"})
    assert [d.get("dedicatedIOThread") for d in bare["disks"]] == [None, None]  # sata
    own = vmi_spec(state, "own")["domain"]["devices"]
    assert (own["tpm"], own["video"]) == ({"enabled": False}, {"type": "vga"})
    assert [d.get("dedicatedIOThread") for d in own["disks"]] == [True, None]


def test_preferences_no_vmi_can_hold_are_stated_on_the_vmi(handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(preference("fancy", {"devices": {
        "preferredDiskBus": "virtio", "preferredDiskIO": "native",
        "preferredPanicDeviceModel": "hyperv"}})))
    run_accepted(handler, state, apply(vm("fancy", {"memory": {"guest": "1Gi"}},
                                          preference={"kind": "VirtualMachinePreference",
                                                      "name": "fancy"})))
    assert reconcile(handler, state, "fancy") == ["create-for-vm"]
    vmi = get(state, "VirtualMachineInstance", "fancy")
    assert [d["disk"]["bus"] for d in vmi["spec"]["domain"]["devices"]["disks"]] == \
        ["sata", "virtio"]
    assert vmi["metadata"]["annotations"]["virtbus.io/unapplied-preferences"] == \
        "devices.preferredDiskIO,devices.preferredPanicDeviceModel"
    [honoured] = [c for c in vmi["status"]["conditions"] if c["type"] == "SpecHonoured"]
    assert (honoured["status"], honoured["reason"], honoured["message"]) == (
        "False", "NotOnVirtbusNodes",
        "preference devices.preferredDiskIO, devices.preferredPanicDeviceModel: a virtbus VMI "
        "has no field to take them, so they were not applied")


def test_devices_io_threads_and_max_guest_come_from_the_instancetype(
        handler: SyncHandler) -> None:
    state = ClusterState()
    gpu = {"name": "gpu0", "deviceName": "nvidia.com/A10"}
    manifest = instancetype("gn1.xlarge", 2, "4Gi")
    manifest["spec"] |= {"gpus": [gpu], "ioThreadsPolicy": "auto"}
    manifest["spec"]["memory"]["maxGuest"] = "8Gi"
    run_accepted(handler, state, apply(manifest))
    matcher = {"name": "gn1.xlarge", "kind": "VirtualMachineInstancetype"}
    run_accepted(handler, state, apply(vm("gpu", instancetype=matcher)))
    assert "create-for-vm" in reconcile(handler, state, "gpu")
    domain = vmi_spec(state, "gpu")["domain"]
    assert (domain["devices"]["gpus"], domain["ioThreadsPolicy"],
            domain["memory"]["maxGuest"]) == ([gpu], "auto", "8Gi")
    own = vm("own", {"devices": {"disks": DISKS, "gpus": [gpu]}}, instancetype=matcher)
    refused = run(handler, state, apply(own)).outcome
    assert refused.reason == ("VM field(s) spec.template.spec.domain.devices.gpus conflicts "
                              "with selected instance type")
