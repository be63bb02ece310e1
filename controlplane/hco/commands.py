"""HyperConverged and operand commands: admission, uninstall, out-of-band writes, and the
HCO controller's own writes.

| kind      | verb           | who        | decides                                            |
|-----------|----------------|------------|----------------------------------------------------|
| HCO       | apply          | anyone     | validate_hco (nodePlacement vs existing VMs)       |
| HCO       | create-default | controller | the seed defaults, if there never was an HCO       |
| HCO       | delete         | anyone     | check_uninstall: refuse, or delete the VMs with it |
| HCO       | status         | controller | conditions (transition times kept), failures       |
| operand   | apply          | anyone     | an out-of-band write, recorded with its actor      |
| operand   | reconcile      | controller | write what HCO derived: a revert when the newest   |
|           |                |            | write was out of band, else a derived write        |
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from controlplane.aggregate import Aggregate
from controlplane.decision import Decision, Rejected, handles
from controlplane.hco import jsonpatch
from controlplane.hco.conditions import merge_conditions, system_health
from controlplane.hco.desired import pending_write
from controlplane.hco.operands import OPERANDS
from controlplane.hco.validation import check_uninstall, validate_hco
from events.api import hco_defaults as d
from events.api.base import ObjectMeta
from events.api.errors import InvalidSpec
from events.api.hco import Condition, HyperConverged, OperandObject
from events.language.codec import now
from events.language.ids import random_uuid
from events.language.kinds.hco import (
    HyperConvergedCreated,
    HyperConvergedDeleted,
    HyperConvergedStatusChanged,
    HyperConvergedUpdated,
    JsonPatchFailure,
    OperandApplied,
    OperandDeleted,
    OperandModified,
    OperandReverted,
    hco_id,
    operand_id,
)
from events.language.kinds.vm import VM_KIND, VirtualMachineDeleted
from projections.kinds.hco import HyperConvergedView, OperandView
from projections.kinds.vm import VirtualMachineView
from projections.views import iso

KIND = d.KIND


class StatusReport(msgspec.Struct, frozen=True, kw_only=True):
    """The controller's `status` command body: conditions as computed, without times."""

    conditions: list[Condition]
    observed_generation: int
    patch_failures: list[JsonPatchFailure] = []


def load_hco(d_: Decision) -> Aggregate[HyperConvergedView]:
    return d_.load(hco_id(), HyperConvergedView)


def existing_vms(d_: Decision) -> Iterator[Aggregate[VirtualMachineView]]:
    """Every VM that exists, each loaded only when the caller gets to it; the decision is
    then guarded against any VM changing meanwhile (a VM created while the workloads'
    placement changes: write skew)."""
    return d_.all_existing(VM_KIND, VirtualMachineView)


def status_unchanged(hco: HyperConvergedView, report: StatusReport) -> bool:
    """Whether recording `report` would change nothing (condition times aside): asked by
    the controller before it sends one and by the handler on fresh state."""
    def key(conditions: list[Condition]) -> list[tuple[str, str, str, str]]:
        return [(c.type, c.status, c.reason, c.message) for c in conditions]

    return (key(hco.conditions) == key(report.conditions)
            and hco.observed_generation == report.observed_generation
            and hco.patch_failures == report.patch_failures)


def _decode_hco(d_: Decision) -> HyperConverged:
    """The submitted HyperConverged; it lives in HCO's namespace whatever the client said."""
    hco = d_.submitted(HyperConverged)
    if hco.metadata.name != d.DEFAULT_NAME:
        raise InvalidSpec("metadata.name", f"must be {d.DEFAULT_NAME}: there is one "
                                           "HyperConverged per cluster")
    hco.metadata.namespace = d.DEFAULT_NAMESPACE
    return hco


def _record(d_: Decision, hco: HyperConverged) -> None:
    """Create or update the HyperConverged aggregate with `hco` (already validated)."""
    agg = load_hco(d_)
    old = agg.state
    src = hco.metadata
    meta = ObjectMeta(name=src.name, namespace=src.namespace, labels=src.labels,
                      annotations=src.annotations)
    unsafe = jsonpatch.unsafe_modification_counts(meta.annotations)
    if not old.exists:
        d_.trigger(agg, HyperConvergedCreated, uid=random_uuid(), metadata=meta,
                   spec=hco.spec, unsafe_modifications=unsafe)
        return
    if old.spec == hco.spec and old.metadata == meta:
        return
    d_.trigger(agg, HyperConvergedUpdated, metadata=meta, spec=hco.spec,
               generation=old.generation + (old.spec != hco.spec), unsafe_modifications=unsafe)


@handles(KIND, "apply")
def apply(d_: Decision) -> None:
    hco = _decode_hco(d_)
    old = load_hco(d_).state
    validate_hco(hco, vms_exist=next(existing_vms(d_), None) is not None,
                 previous=old.spec if old.exists else None)
    _record(d_, hco)


@handles(KIND, "create-default", internal=True)
def create_default(d_: Decision) -> None:
    """The controller's first start: the effective configuration must always exist. A
    HyperConverged that was ever written (even deleted since) is left alone."""
    if load_hco(d_).version == 0:
        _record(d_, HyperConverged())


@handles(KIND, "delete")
def delete(d_: Decision) -> None:
    agg = load_hco(d_)
    if not agg.exists:
        raise Rejected(f'hyperconverged "{d_.command.name}" not found', "metadata.name")
    hco = HyperConverged(metadata=agg.state.metadata, spec=agg.state.spec)
    vms = list(existing_vms(d_))
    removed: list[str] = []
    match check_uninstall(hco, vms_exist=bool(vms)):
        case "remove-workloads":
            for vm in vms:
                d_.trigger(vm, VirtualMachineDeleted)
                removed.append(f"{vm.state.metadata.namespace}/{vm.state.metadata.name}")
        case "proceed":
            pass
    d_.trigger(agg, HyperConvergedDeleted, removed_workloads=removed)
    for op in OPERANDS:
        operand = d_.load(operand_id(op.kind, op.name(hco)), OperandView)
        if operand.exists:
            d_.trigger(operand, OperandDeleted, kind=op.kind)


@handles(KIND, "status", internal=True)
def status(d_: Decision) -> None:
    """Record the controller's conditions when they differ from the recorded ones."""
    agg = load_hco(d_)
    if not agg.exists:
        return
    report = d_.body(StatusReport)
    old = agg.state
    if status_unchanged(old, report):
        return
    merged = merge_conditions(old.conditions, report.conditions, now=iso(now()))
    d_.trigger(agg, HyperConvergedStatusChanged, conditions=merged,
               observed_generation=report.observed_generation,
               system_health_status=system_health(merged),
               patch_failures=report.patch_failures)


def _operand_apply(d_: Decision) -> None:
    """Anyone's write of an operand CR: recorded as out of band, for the controller to revert."""
    obj = d_.submitted(OperandObject)
    agg = d_.load(operand_id(obj.kind, obj.metadata.name), OperandView)
    if not agg.exists:
        raise Rejected(f'{obj.kind.lower()} "{obj.metadata.name}" not found: the '
                       "HyperConverged creates and owns its operands", "metadata.name")
    current = agg.state.object
    meta = {**current["metadata"], "labels": obj.metadata.labels,
            "annotations": obj.metadata.annotations}
    written = {**current, "metadata": {k: v for k, v in meta.items() if v}, "spec": obj.spec}
    if written != current:
        d_.trigger(agg, OperandModified, kind=obj.kind, object=written)


def _operand_reconcile(d_: Decision) -> None:
    """The controller's write of what HCO derived, decided against the operand as it is now,
    and only while the HyperConverged is there: a write the controller decided before its
    delete may be recorded after it, and must not bring a deleted operand back."""
    if not load_hco(d_).exists:
        return
    desired = d_.command.manifest or {}
    kind, name = str(desired["kind"]), str(desired["metadata"]["name"])
    agg = d_.load(operand_id(kind, name), OperandView)
    if not agg.exists:
        d_.trigger(agg, OperandApplied, kind=kind, object=desired)
        return
    paths = pending_write(desired, agg.state.object, out_of_band=agg.state.out_of_band)
    if paths is None:
        return
    if agg.state.out_of_band:
        d_.trigger(agg, OperandReverted, kind=kind, component=name, drift=paths, object=desired)
    else:
        d_.trigger(agg, OperandApplied, kind=kind, object=desired, drift=paths)


for _op in OPERANDS:
    handles(_op.kind, "apply")(_operand_apply)
    handles(_op.kind, "reconcile", internal=True)(_operand_reconcile)
