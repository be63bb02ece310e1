"""Commands of VirtualMachineInstanceReplicaSets: from users `apply`, `delete`, `scale`
(kubectl's, through the scale subresource); from the controller `create-replica`,
`delete-replica`, `adopt`, `release` and `clear-failure`.

The controller decides on its read model; these handlers decide again on the log, with a
guard on every VMI: a replica is created only while fewer are active than `spec.replicas`,
and deleted only while more are, however often, however late, and on however stale a state
the controller proposed it.
"""

from __future__ import annotations

import msgspec

from controlplane.aggregate import Aggregate
from controlplane.decision import Decision, Rejected, apply_namespaced, handles
from controlplane.feature_gates import VM_METADATA_PATH, VM_SPEC_PATH, admit_by_feature_gates
from controlplane.preset.commands import presets_in
from controlplane.vmi.commands import create, request_deletion
from events.api.base import ObjectMeta
from events.api.errors import InvalidSpec
from events.api.names import check_dns1123_label
from events.api.replicaset import REPLICA_SET, ScaleBody, VirtualMachineInstanceReplicaSet
from events.api.scheduling import selector_matches
from events.language.kinds.replicaset import (
    REPLICA_SET_KIND,
    ReplicaSetApplied,
    ReplicaSetDeleted,
    ReplicaSetReplicaFailure,
    ReplicaSetReplicaFailureCleared,
    ReplicaSetScaled,
)
from events.language.kinds.vm import (
    VMI_KIND,
    VirtualMachineInstanceAdopted,
    VirtualMachineInstanceReleased,
)
from events.language.subjects import aggregate_id
from projections.kinds.replicaset import ReplicaSetView
from projections.kinds.vm import VirtualMachineInstanceView


class ReplicaBody(msgspec.Struct, frozen=True, kw_only=True):
    """`create-replica` / `delete-replica`: the VMI's name."""

    name: str


def existing_replica_set(d: Decision) -> Aggregate[ReplicaSetView]:
    return d.existing(REPLICA_SET_KIND, ReplicaSetView, REPLICA_SET.lower())


def active_replicas(d: Decision,
                    rs: ReplicaSetView) -> list[Aggregate[VirtualMachineInstanceView]]:
    """The replica set's VMIs that count (not final, not being deleted), as the log has them
    now; the decision is guarded against any VMI of its namespace changing meanwhile."""
    namespace, name = rs.metadata.namespace, rs.metadata.name
    return [vmi for vmi in d.all_existing(VMI_KIND, VirtualMachineInstanceView, namespace)
            if vmi.state.replica_set == name and not vmi.state.final
            and vmi.state.deletion_requested_at is None]


@handles(REPLICA_SET, "apply")
def apply(d: Decision) -> None:
    def admit_new(new: VirtualMachineInstanceReplicaSet) -> None:
        """KubeVirt's admitter checks feature gates on CREATE."""
        template = new.spec.template
        admit_by_feature_gates(d, template.spec, VM_SPEC_PATH, template.metadata.annotations,
                               VM_METADATA_PATH)

    apply_namespaced(d, VirtualMachineInstanceReplicaSet, REPLICA_SET_KIND, ReplicaSetView,
                     ReplicaSetApplied, admit_new=admit_new)


@handles(REPLICA_SET, "scale")
def scale(d: Decision) -> None:
    rs = existing_replica_set(d)
    try:
        replicas = msgspec.convert(d.command.manifest or {}, ScaleBody).replicas
    except msgspec.ValidationError:
        raise InvalidSpec("spec.replicas", "must be a whole number, 0 or more") from None
    if rs.state.spec is None or rs.state.spec.replicas == replicas:
        return
    d.trigger(rs, ReplicaSetScaled, replicas=replicas, generation=rs.state.generation + 1)


@handles(REPLICA_SET, "delete")
def delete(d: Decision) -> None:
    """The replica set and its VMIs (KubeVirt's owner references: collected with it)."""
    rs = existing_replica_set(d)
    for vmi in active_replicas(d, rs.state):
        request_deletion(d, vmi)
    d.trigger(rs, ReplicaSetDeleted)


@handles(REPLICA_SET, "create-replica", internal=True)
def create_replica(d: Decision) -> None:
    """One more VMI from the template, while fewer than `spec.replicas` are active. A VMI
    the cluster refuses (a feature gate, conflicting presets) is the ReplicaFailure
    condition, as KubeVirt's `checkFailure` sets it, recorded when its message changes."""
    rs = existing_replica_set(d)
    state, name = rs.state, d.body(ReplicaBody).name
    check_dns1123_label("manifest.name", name)
    if state.spec is None or state.paused:
        raise Rejected("the replica set is paused")
    have = len(active_replicas(d, state))
    if have >= state.spec.wanted:
        raise Rejected(f"no longer needed: {have} of {state.spec.wanted} replicas exist")
    vmi = d.load(aggregate_id(VMI_KIND, d.command.namespace, name), VirtualMachineInstanceView)
    if vmi.exists:
        raise Rejected(f'virtualmachineinstance "{d.command.namespace}/{name}" already exists',
                       "manifest.name")
    template = state.spec.template
    meta = ObjectMeta(name=name, namespace=d.command.namespace,
                      labels=dict(template.metadata.labels),
                      annotations=dict(template.metadata.annotations))
    try:
        admit_by_feature_gates(d, template.spec, VM_SPEC_PATH, template.metadata.annotations,
                               VM_METADATA_PATH)
        create(d, vmi, meta, template.spec, presets_in(d, d.command.namespace),
               replica_set=state.metadata.name)
    except (InvalidSpec, Rejected) as refused:
        message = str(refused)
        if state.failure is None or state.failure.message != message:
            d.trigger(rs, ReplicaSetReplicaFailure, reason="FailedCreate", message=message)
        return
    if state.failure is not None:
        d.trigger(rs, ReplicaSetReplicaFailureCleared)


@handles(REPLICA_SET, "delete-replica", internal=True)
def delete_replica(d: Decision) -> None:
    """One VMI of the replica set fewer, while more than `spec.replicas` are active."""
    rs = existing_replica_set(d)
    state, name = rs.state, d.body(ReplicaBody).name
    if state.spec is None or state.paused:
        raise Rejected("the replica set is paused")
    active = active_replicas(d, state)
    if len(active) <= state.spec.wanted:
        raise Rejected(f"no longer needed: {len(active)} of {state.spec.wanted} replicas exist")
    victim = next((vmi for vmi in active if vmi.state.metadata.name == name), None)
    if victim is None:
        raise Rejected(f"{name} is not an active replica of this replica set", "manifest.name")
    request_deletion(d, victim)


def named_vmi(d: Decision) -> Aggregate[VirtualMachineInstanceView]:
    """The existing VMI the command's body names, in the command's namespace."""
    name = d.body(ReplicaBody).name
    check_dns1123_label("manifest.name", name)
    vmi = d.load(aggregate_id(VMI_KIND, d.command.namespace, name), VirtualMachineInstanceView)
    if not vmi.exists:
        raise Rejected(f'virtualmachineinstance "{d.command.namespace}/{name}" not found',
                       "manifest.name")
    return vmi


@handles(REPLICA_SET, "adopt", internal=True)
def adopt(d: Decision) -> None:
    """An orphan VMI the selector matches becomes a replica (KubeVirt's `ClaimObject`):
    refused if another controller owns it by now, it is being deleted, or its labels
    changed."""
    rs = existing_replica_set(d)
    vmi = named_vmi(d)
    state = vmi.state
    if state.owner or state.replica_set:
        raise Rejected(f"{state.metadata.name} has a controller already", "manifest.name")
    if state.deletion_requested_at is not None:
        raise Rejected(f"{state.metadata.name} is being deleted", "manifest.name")
    if rs.state.spec is None or not selector_matches(rs.state.spec.selector,
                                                     state.metadata.labels):
        raise Rejected(f"the selector does not match {state.metadata.name}'s labels",
                       "manifest.name")
    d.trigger(vmi, VirtualMachineInstanceAdopted, replica_set=rs.state.metadata.name)


@handles(REPLICA_SET, "release", internal=True)
def release(d: Decision) -> None:
    """A replica whose labels the selector no longer matches is an orphan again (KubeVirt's
    `ReleaseDetachedObject`)."""
    rs = existing_replica_set(d)
    vmi = named_vmi(d)
    state = vmi.state
    if state.replica_set != rs.state.metadata.name:
        raise Rejected(f"{state.metadata.name} is not a replica of this replica set",
                       "manifest.name")
    if rs.state.spec is not None and selector_matches(rs.state.spec.selector,
                                                      state.metadata.labels):
        raise Rejected(f"the selector still matches {state.metadata.name}'s labels",
                       "manifest.name")
    d.trigger(vmi, VirtualMachineInstanceReleased)


@handles(REPLICA_SET, "clear-failure", internal=True)
def clear_failure(d: Decision) -> None:
    """Nothing failed on the last pass (KubeVirt removes ReplicaFailure then)."""
    rs = existing_replica_set(d)
    if rs.state.failure is None:
        raise Rejected("no ReplicaFailure to clear")
    d.trigger(rs, ReplicaSetReplicaFailureCleared)
