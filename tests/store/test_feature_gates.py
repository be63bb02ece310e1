"""Admission by feature gate on the real store: a VM or VMI that uses a gated feature is
refused, naming the field, while the effective KubeVirt CR (derived by the HCO controller
from the HyperConverged) lacks the gate, and nothing is appended; with the gate on it is
accepted. A VM admitted under the gate gets its VMI refused once the gate is turned off."""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

import msgspec
import pytest
from structlog.testing import capture_logs

from controlplane.feature_gates import (
    HOOK_SIDECARS_ANNOTATION,
    SIDECAR,
    check_annotation_gates,
    check_feature_gates,
)
from controlplane.hco.controller import HCOController
from controlplane.vm.controller import VMController
from events.api import hco_defaults as d
from events.api.errors import InvalidSpec
from events.api.vm import VirtualMachineInstanceSpec
from events.language.codec import Event, decode
from events.language.messages import Command
from projections.cluster import ClusterState
from projections.hco import effective_kubevirt
from projections.kinds.hco import OperandView
from tests.store.helpers import SyncHandler, run


class Case(NamedTuple):
    feature: str
    hco_gate: str
    """The HyperConverged `spec.featureGates` entry."""
    gate: str
    """The KubeVirt gate it maps to."""
    field: str
    """The refused field, relative to the VMI spec."""


CASES = [
    Case("downward-metrics-device", "downwardMetrics", "DownwardMetrics",
         "domain.devices.downwardMetrics"),
    Case("downward-metrics-volume", "downwardMetrics", "DownwardMetrics",
         "volumes[1].downwardMetrics"),
    Case("lun-reservation", "persistentReservation", "PersistentReservation",
         "domain.devices.disks[1].lun.reservation"),
]
KINDS = {"VirtualMachine": "spec.template.spec", "VirtualMachineInstance": "spec"}
"""Kind -> where its VMI spec is."""
HCO_GATES = ("downwardMetrics", "persistentReservation")


def spec_using(feature: str) -> dict[str, Any]:
    """A valid VMI spec whose only gated part is `feature`."""
    disks: list[dict[str, Any]] = [{"name": "root", "disk": {}}]
    volumes: list[dict[str, Any]] = [{"name": "root", "containerDisk": {"image": "img"}}]
    devices: dict[str, Any] = {"disks": disks}
    match feature:
        case "downward-metrics-device":
            devices["downwardMetrics"] = {}
        case "downward-metrics-volume":
            disks.append({"name": "metrics", "disk": {"bus": "virtio"}})
            volumes.append({"name": "metrics", "downwardMetrics": {}})
        case "lun-reservation":
            disks.append({"name": "shared", "lun": {"reservation": True}})
            volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}})
    return {"domain": {"resources": {"requests": {"memory": "64Mi"}}, "devices": devices},
            "volumes": volumes}


def vm(name: str, spec: dict[str, Any], run_strategy: str = "Halted") -> dict[str, Any]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"runStrategy": run_strategy, "template": {"spec": spec}}}


def vmi(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def apply(manifest: dict[str, Any]) -> Command:
    meta = manifest["metadata"]
    return Command(id=str(uuid.uuid4()), actor="user:erin", kind=manifest["kind"], verb="apply",
                   namespace=meta.get("namespace", ""), name=meta["name"], manifest=manifest)


def apply_hco(handler: SyncHandler, state: ClusterState, spec: dict[str, Any],
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """Apply a HyperConverged with `spec` (and `annotations`) and let the HCO controller
    write the KubeVirt CR it derives; that CR's `spec.configuration`, as written."""
    hco = {"apiVersion": d.API_VERSION, "kind": d.KIND,
           "metadata": {"name": d.DEFAULT_NAME, "namespace": d.DEFAULT_NAMESPACE,
                        "annotations": annotations or {}},
           "spec": spec}
    assert run(handler, state, apply(hco)).outcome.accepted
    for command in HCOController().reconcile(state):
        assert run(handler, state, command).outcome.accepted
    kubevirt = effective_kubevirt(state)
    assert kubevirt is not None
    configuration: dict[str, Any] = kubevirt["spec"]["configuration"]
    return configuration


def set_gates(handler: SyncHandler, state: ClusterState, **gates: bool) -> list[str]:
    """The KubeVirt CR's gates, as written, after a HyperConverged with these featureGates."""
    gates_written: list[str] = apply_hco(handler, state, {"featureGates": gates})[
        "developerConfiguration"]["featureGates"]
    return gates_written


def stored_event(handler: SyncHandler, sequence: int) -> Event:
    """The event stored at `sequence`, as the control loop receives it."""
    [stored] = handler.recorder.select_notifications(sequence, 1)
    return decode(stored.topic, stored.state)


def last_sequence(handler: SyncHandler) -> int:
    return handler.recorder.max_notification_id() or 0


def appended_since(handler: SyncHandler, sequence: int) -> list[str]:
    """The topics of the events stored after `sequence`."""
    return [n.topic for n in handler.recorder.select_notifications(
        sequence, 100, inclusive_of_start=False)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=[c.feature for c in CASES])
def test_gated_feature_is_refused_until_its_gate_is_on(
        handler: SyncHandler, kind: str, case: Case) -> None:
    state = ClusterState()
    build = vm if kind == "VirtualMachine" else vmi
    manifest = build("gated", spec_using(case.feature))
    # Every other gate on: the refusal is this gate's, not a blanket one.
    others = {g: True for g in HCO_GATES if g != case.hco_gate}
    assert case.gate not in set_gates(handler, state, **others, **{case.hco_gate: False})
    before = last_sequence(handler)
    refused = run(handler, state, apply(manifest)).outcome
    assert not refused.accepted
    assert refused.field == f"{KINDS[kind]}.{case.field}"
    assert refused.reason == f"the {case.gate} feature gate is not enabled"
    assert appended_since(handler, before) == ["CommandRejected.v1"]
    assert case.gate in set_gates(handler, state, **others, **{case.hco_gate: True})
    accepted = run(handler, state, apply(manifest)).outcome
    assert accepted.accepted and accepted.sequences


def test_without_any_kubevirt_cr_gated_features_are_refused(handler: SyncHandler) -> None:
    """Before HCO has written a KubeVirt CR no gate is on (KubeVirt's defaults)."""
    state = ClusterState()
    before = last_sequence(handler)
    refused = run(handler, state, apply(vm("early", spec_using("lun-reservation")))).outcome
    assert (refused.accepted, refused.field) == (
        False, "spec.template.spec.domain.devices.disks[1].lun.reservation")
    plain = run(handler, state, apply(vm("plain", spec_using("none")))).outcome
    assert plain.accepted
    assert last_sequence(handler) > before


def test_vmi_of_an_admitted_vm_is_refused_once_its_gate_is_off(
        handler: SyncHandler) -> None:
    state = ClusterState()
    set_gates(handler, state, downwardMetrics=True)
    admitted = run(handler, state, apply(vm("metrics", spec_using("downward-metrics-volume"),
                                             run_strategy="Always")))
    assert admitted.outcome.accepted
    set_gates(handler, state, downwardMetrics=False)
    [create] = VMController().reconcile(state, "default", "metrics")
    assert create.verb == "create-for-vm"
    before = last_sequence(handler)
    with capture_logs() as logs:
        refused = run(handler, state, create).outcome
    assert (refused.accepted, refused.field) == (False, "spec.volumes[1].downwardMetrics")
    assert appended_since(handler, before) == ["CommandRejected.v1"]
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert [(e["name"], e["field"]) for e in warned] == [
        ("metrics", "spec.volumes[1].downwardMetrics")]
    # The gate back on: the KubeVirt CR's change wakes the VM controller. Its decision reads
    # the new configuration, so it is a new command; the refused one stays refused.
    set_gates(handler, state, downwardMetrics=True)
    [kubevirt] = [v for v in state.views.values()
                  if isinstance(v, OperandView) and v.kind == "KubeVirt"]
    [again] = VMController().on_event(state, stored_event(handler, kubevirt.last_sequence))
    assert again.verb == "create-for-vm"
    assert again.id != create.id
    assert run(handler, state, create).outcome == refused
    created = run(handler, state, again).outcome
    assert created.accepted
    assert state.vmi("default", "metrics") is not None


def test_first_use_in_table_order_is_reported() -> None:
    """Pure: a spec using every gated feature names the first whose gate is off."""
    raw = spec_using("lun-reservation")
    raw["domain"]["devices"]["downwardMetrics"] = {}
    spec = msgspec.convert(raw, VirtualMachineInstanceSpec)
    with pytest.raises(InvalidSpec) as neither:
        check_feature_gates(spec, frozenset(), "spec")
    assert neither.value.field == "spec.domain.devices.downwardMetrics"
    with pytest.raises(InvalidSpec) as one:
        check_feature_gates(spec, frozenset({"DownwardMetrics"}), "spec")
    assert one.value.field == "spec.domain.devices.disks[1].lun.reservation"
    check_feature_gates(spec, frozenset({"DownwardMetrics", "PersistentReservation"}), "spec")


SIDECARS = '[{"args": ["--version", "v1alpha2"], "image": "registry/example-hook-sidecar"}]'
SIDECAR_JSONPATCH = ('[{"op": "add", "value": "Sidecar",'
                     ' "path": "/spec/configuration/developerConfiguration/featureGates/-"}]')
"""HCO has no field for KubeVirt's Sidecar gate: its KubeVirt jsonpatch annotation adds it."""


@pytest.mark.parametrize(("kind", "annotations_at"), [
    ("VirtualMachine", "spec.template.metadata.annotations"),
    ("VirtualMachineInstance", "metadata.annotations"),
])
def test_hook_sidecar_annotation_is_refused_until_the_sidecar_gate_is_on(
        handler: SyncHandler, kind: str, annotations_at: str) -> None:
    state = ClusterState()
    annotations = {HOOK_SIDECARS_ANNOTATION: SIDECARS}
    if kind == "VirtualMachine":
        manifest = vm("hooked", spec_using("none"))
        manifest["spec"]["template"]["metadata"] = {"annotations": annotations}
    else:
        manifest = vmi("hooked", spec_using("none"))
        manifest["metadata"]["annotations"] = annotations
    gates = apply_hco(handler, state, {})["developerConfiguration"]["featureGates"]
    assert SIDECAR not in gates
    before = last_sequence(handler)
    refused = run(handler, state, apply(manifest)).outcome
    assert (refused.accepted, refused.field, refused.reason) == (
        False, f"{annotations_at}.{HOOK_SIDECARS_ANNOTATION}",
        "the Sidecar feature gate is not enabled")
    assert appended_since(handler, before) == ["CommandRejected.v1"]
    patched = apply_hco(handler, state, {}, {d.KUBEVIRT_JSONPATCH_ANNOTATION: SIDECAR_JSONPATCH})
    assert SIDECAR in patched["developerConfiguration"]["featureGates"]
    accepted = run(handler, state, apply(manifest)).outcome
    assert accepted.accepted and accepted.sequences


def test_empty_hook_sidecar_annotation_needs_no_gate() -> None:
    """KubeVirt checks for a non-empty value only."""
    check_annotation_gates({HOOK_SIDECARS_ANNOTATION: ""}, frozenset(), "metadata")
    with pytest.raises(InvalidSpec) as refused:
        check_annotation_gates({HOOK_SIDECARS_ANNOTATION: "[]"}, frozenset(), "metadata")
    assert refused.value.field == f"metadata.annotations.{HOOK_SIDECARS_ANNOTATION}"


HOST_DISK = {"volumes": [{"name": "host", "hostDisk": {"path": "/var/lib/images/d.img",
                                                        "type": "DiskOrCreate",
                                                        "capacity": "1Gi"}}],
             "domain": {"resources": {"requests": {"memory": "64Mi"}},
                        "devices": {"disks": [{"name": "host", "disk": {}}]}}}
DRA_GPU = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-tmpl"}],
           "domain": {"resources": {"requests": {"memory": "64Mi"}},
                      "devices": {"gpus": [{"name": "g", "claimName": "gpu",
                                            "requestName": "pgpu"}]}}}


def test_kubevirts_host_disk_example_is_refused_by_gate_with_hcos_defaults(
        handler: SyncHandler) -> None:
    """KubeVirt's own example `vmi-host-disk` is admitted by schema and refused for the gate
    HCO leaves off (Alpha), as KubeVirt refuses it; the gate added, it is admitted."""
    state = ClusterState()
    apply_hco(handler, state, {})
    refused = run(handler, state, apply(vmi("gated", HOST_DISK))).outcome
    assert (refused.accepted, refused.field, refused.reason) == (
        False, "spec.volumes[0].hostDisk", "the HostDisk feature gate is not enabled")
    patch = ('[{"op": "add", "value": "HostDisk", '
             '"path": "/spec/configuration/developerConfiguration/featureGates/-"}]')
    apply_hco(handler, state, {}, {d.KUBEVIRT_JSONPATCH_ANNOTATION: patch})
    assert run(handler, state, apply(vmi("gated", HOST_DISK))).outcome.accepted


def test_a_beta_gate_is_on_until_disabled(handler: SyncHandler) -> None:
    """KubeVirt's `vmi-dra-pgpu`: GPUsWithDRA is Beta, so KubeVirt admits it unless
    `disabledFeatureGates` names the gate, which refuses it."""
    state = ClusterState()
    apply_hco(handler, state, {})
    assert run(handler, state, apply(vmi("dra", DRA_GPU))).outcome.accepted
    patch = ('[{"op": "add", "value": ["GPUsWithDRA"], '
             '"path": "/spec/configuration/developerConfiguration/disabledFeatureGates"}]')
    apply_hco(handler, state, {}, {d.KUBEVIRT_JSONPATCH_ANNOTATION: patch})
    refused = run(handler, state, apply(vmi("disabled", DRA_GPU))).outcome
    assert (refused.accepted, refused.field, refused.reason) == (
        False, "spec.domain.devices.gpus[0].claimName",
        "the GPUsWithDRA feature gate is not enabled")
