"""VirtualMachineInstance commands: from users (apply, delete, and pause / unpause /
soft-reboot of a VMI or of a VM's VMI, as virtctl does) and from controllers and node reports
(create for a VM, schedule, observe)."""

from __future__ import annotations

import ipaddress

import msgspec
import structlog

from controlplane.aggregate import Aggregate
from controlplane.clusterconfig import ClusterConfig
from controlplane.decision import Decision, Rejected, handles
from controlplane.feature_gates import VMI_METADATA_PATH, VMI_SPEC_PATH, admit_by_feature_gates
from controlplane.instancetype.revisions import expand_for_start
from controlplane.preset.commands import fill, presets_in
from controlplane.vm.commands import KIND as VM_KIND_NAME
from controlplane.vm.commands import load_vm
from events.api.base import ObjectMeta
from events.api.domain import CPU
from events.api.errors import InvalidSpec
from events.api.vm import (
    VirtualMachineInstance,
    VirtualMachineInstanceNetworkInterface,
    VirtualMachineInstanceSpec,
)
from events.api.vmi_defaults import POD_BINDINGS, with_pod_interface
from events.language.ids import random_uuid
from events.language.kinds.nodes import NODE_KIND
from events.language.kinds.preset import VirtualMachineInstancePresetConflicted
from events.language.kinds.vm import (
    PAUSED_USER_REQUESTED,
    VM_KIND,
    VMI_KIND,
    VirtualMachineInstanceAgentConnected,
    VirtualMachineInstanceCreated,
    VirtualMachineInstanceDeleted,
    VirtualMachineInstanceDeletionRequested,
    VirtualMachineInstanceInterfacesReported,
    VirtualMachineInstanceNodeAction,
    VirtualMachineInstancePaused,
    VirtualMachineInstancePhaseChanged,
    VirtualMachineInstanceRelabeled,
    VirtualMachineInstanceScheduled,
    VirtualMachineInstanceUnpaused,
    VirtualMachineInstanceUnschedulable,
    VirtualMachineStartRequestDone,
)
from events.language.messages import DomainObservation, InterfacesObservation, node_actor
from events.language.subjects import aggregate_id
from projections.kinds.replicaset import PresetView
from projections.kinds.vm import (
    TERMINAL_PHASES,
    NodeView,
    VirtualMachineInstanceView,
    VirtualMachineView,
)

log = structlog.get_logger(__name__)

KIND = "VirtualMachineInstance"


class ScheduleBody(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler's `schedule`: the node it chose."""

    node: str


class UnschedulableBody(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler's `unschedulable`: why no node fits, in kube-scheduler's words."""

    message: str


class FailBody(msgspec.Struct, frozen=True, kw_only=True):
    """A controller's `fail` (the node under the VMI is lost): why."""

    reason: str = ""


def agent_version(d: Decision, node: str) -> str:
    """The version of `node`'s agent, which launches what is placed there now."""
    view = d.load(aggregate_id(NODE_KIND, "", node), NodeView)
    return view.state.info.agent_version if view.state.info is not None else ""


def load_vmi(d: Decision) -> Aggregate[VirtualMachineInstanceView]:
    return d.target(VMI_KIND, VirtualMachineInstanceView)


def existing_vmi(d: Decision) -> Aggregate[VirtualMachineInstanceView]:
    return d.existing(VMI_KIND, VirtualMachineInstanceView, "virtualmachineinstance")


@handles(KIND, "apply")
def apply(d: Decision) -> None:
    new = d.submitted(VirtualMachineInstance)
    admit_by_feature_gates(d, new.spec, VMI_SPEC_PATH, new.metadata.annotations,
                           VMI_METADATA_PATH)
    vmi = d.load(aggregate_id(VMI_KIND, new.metadata.namespace, new.metadata.name),
                 VirtualMachineInstanceView)
    if vmi.exists:
        stored = vmi.state.spec
        model = stored.domain.cpu.model if stored is not None and stored.domain.cpu else ""
        filled = fill(presets_in(d, new.metadata.namespace), new.metadata, new.spec).spec
        # The same spec applied again changes nothing, whatever the presets and the CPU
        # model defaulting added to it; only its labels may change.
        if all(with_pod_interface(with_cpu_model(filled, model), binding) != stored
               for binding in POD_BINDINGS):
            raise InvalidSpec("spec", "a VirtualMachineInstance's spec cannot change")
        if new.metadata.labels != vmi.state.metadata.labels:
            d.trigger(vmi, VirtualMachineInstanceRelabeled, labels=dict(new.metadata.labels))
        return
    create(d, vmi, new.metadata, new.spec, presets_in(d, new.metadata.namespace))


def with_cluster_cpu_model(d: Decision,
                           spec: VirtualMachineInstanceSpec) -> VirtualMachineInstanceSpec:
    """KubeVirt's VMI defaulting: a VMI created without a CPU model gets the effective
    KubeVirt's `configuration.cpuModel` (the HyperConverged's `defaultCPUModel`), if set.
    The cluster configuration is read only for a VMI that names no model."""
    if spec.domain.cpu is not None and spec.domain.cpu.model:
        return spec
    return with_cpu_model(spec, ClusterConfig.of_decision(d).cpu_model)


def with_cpu_model(spec: VirtualMachineInstanceSpec, model: str) -> VirtualMachineInstanceSpec:
    """`spec` with CPU `model` where it names none (and `model` is not empty)."""
    cpu = spec.domain.cpu or CPU()
    if cpu.model or not model:
        return spec
    domain = msgspec.structs.replace(spec.domain, cpu=msgspec.structs.replace(cpu, model=model))
    return msgspec.structs.replace(spec, domain=domain)


def create(d: Decision, vmi: Aggregate[VirtualMachineInstanceView], meta: ObjectMeta,
           spec: VirtualMachineInstanceSpec, presets: list[PresetView],
           **owned: str | int) -> None:
    """A new VMI as KubeVirt's mutating webhook makes it on CREATE: the matching `presets`
    fill it (each conflict recorded on it), then the cluster's CPU model and, where it lists
    no interface, the pod interface (`vmi_defaults.with_pod_interface`). `owned`: its
    owner's fields of `VirtualMachineInstanceCreated`."""
    filled = fill(presets, meta, spec)
    d.trigger(vmi, VirtualMachineInstanceCreated, uid=random_uuid(),
              metadata=msgspec.structs.replace(meta, annotations=filled.annotations),
              spec=with_pod_interface(with_cluster_cpu_model(d, filled.spec),
                                      ClusterConfig.of_decision(d).pod_binding),
              **owned)
    for conflict in filled.conflicts:
        d.trigger(vmi, VirtualMachineInstancePresetConflicted, preset=conflict.preset,
                  applied=conflict.applied, message=conflict.message)


@handles(KIND, "create-for-vm", internal=True)
def create_for_vm(d: Decision) -> None:
    """The VM controller's: a VMI from the VM's template, at the VM's restart count; it meets
    the VM's Start request, if one waits."""
    cmd = d.command
    vm = d.load(aggregate_id(VM_KIND, cmd.namespace, cmd.name), VirtualMachineView)
    vmi = load_vmi(d)
    if not vm.exists or not vm.state.starts_without_vmi or vmi.exists or vm.state.spec is None:
        raise Rejected("no longer needed")
    # Read before the expansion, which warns: a read the memory lacks runs the handler again.
    presets = presets_in(d, cmd.namespace)
    template = vm.state.spec.template
    expanded = expand_for_start(d, vm.id)
    spec = expanded.spec if expanded is not None else template.spec
    try:
        admit_by_feature_gates(d, spec, VMI_SPEC_PATH, template.metadata.annotations,
                               VMI_METADATA_PATH)
    except InvalidSpec as refused:
        # Admitted while the gate was on; KubeVirt's VMI webhook refuses it now, and so here.
        log.warning("VMI of an admitted VM refused: its feature gate has been turned off",
                    namespace=cmd.namespace, name=cmd.name, field=refused.field,
                    reason=refused.rule)
        raise
    labels = {**template.metadata.labels, "kubevirt.io/vm": cmd.name}
    annotations = expanded.annotations if expanded is not None else template.metadata.annotations
    meta = ObjectMeta(name=cmd.name, namespace=cmd.namespace, labels=labels,
                      annotations=dict(annotations))
    create(d, vmi, meta, spec, presets, owner=cmd.name, restart_count=vm.state.restart_count)
    if vm.state.start_requested:
        d.trigger(vm, VirtualMachineStartRequestDone)


@handles(KIND, "schedule", internal=True)
def schedule(d: Decision) -> None:
    vmi = existing_vmi(d)
    node = d.body(ScheduleBody).node
    if vmi.state.node or vmi.state.phase != "Pending" or vmi.state.deletion_requested_at:
        raise Rejected("already scheduled or going away")
    d.trigger(vmi, VirtualMachineInstanceScheduled, node=node,
              launcher_version=agent_version(d, node))


@handles(KIND, "unschedulable", internal=True)
def unschedulable(d: Decision) -> None:
    """The scheduler found no node: the condition changes only when its message does."""
    vmi = existing_vmi(d)
    message = d.body(UnschedulableBody).message
    state = vmi.state
    if state.node or state.phase != "Pending" or state.deletion_requested_at:
        raise Rejected("already scheduled or going away")
    if message != state.unschedulable_message:
        d.trigger(vmi, VirtualMachineInstanceUnschedulable, message=message)


@handles(KIND, "fail", internal=True)
def fail(d: Decision) -> None:
    """A controller's verdict, e.g. the node under a VMI is lost."""
    vmi = existing_vmi(d)
    reason = d.body(FailBody).reason
    if vmi.state.phase in TERMINAL_PHASES:
        raise Rejected("already finished")
    d.trigger(vmi, VirtualMachineInstancePhaseChanged, phase="Failed", reason=reason)
    if vmi.state.deletion_requested_at is not None:
        # Its node, lost, will not report it gone: nothing is left to wait for, and the stop
        # dispatched with the deletion reaches the node if it comes back.
        d.trigger(vmi, VirtualMachineInstanceDeleted)


@handles(KIND, "delete")
def delete(d: Decision) -> None:
    request_deletion(d, existing_vmi(d), d.command.grace_period_seconds)


def request_deletion(d: Decision, vmi: Aggregate[VirtualMachineInstanceView],
                     grace: int | None = None) -> None:
    """Delete the VMI: its node stops the guest (within `grace`, else the VMI's own grace
    period), or it is gone at once where nothing runs."""
    if vmi.state.deletion_requested_at is not None:
        return
    if grace is None:
        grace = vmi.state.spec.grace_period_seconds if vmi.state.spec is not None else 0
    d.trigger(vmi, VirtualMachineInstanceDeletionRequested, grace_period_seconds=grace)
    if not vmi.state.node or vmi.state.phase in TERMINAL_PHASES:
        # Nothing runs anywhere: no node has to stop it, so it is gone at once.
        d.trigger(vmi, VirtualMachineInstanceDeleted)


def reported_vmi(d: Decision, uid: str) -> Aggregate[VirtualMachineInstanceView]:
    """The VMI instance a node's report is about, which must run on the reporting node."""
    vmi = load_vmi(d)
    state = vmi.state
    if not vmi.exists or state.uid != uid:
        raise Rejected("stale report: no such VMI instance")
    if d.command.actor != node_actor(state.node):
        raise Rejected(f"{d.command.actor} reported a VMI that runs on node {state.node!r}",
                       "node")
    return vmi


@handles(KIND, "observe", internal=True)
def observe(d: Decision) -> None:
    """A node's report of a domain, turned into phase changes and final deletion."""
    obs = d.body(DomainObservation)
    vmi = reported_vmi(d, obs.uid)
    state = vmi.state
    if obs.gone:
        if state.phase not in TERMINAL_PHASES:
            asked = state.deletion_requested_at is not None
            phase = "Succeeded" if asked or obs.phase == "Succeeded" else "Failed"
            d.trigger(vmi, VirtualMachineInstancePhaseChanged, phase=phase, reason=obs.reason)
        if state.deletion_requested_at is not None:
            d.trigger(vmi, VirtualMachineInstanceDeleted)
        return
    if obs.phase != state.phase and state.phase not in TERMINAL_PHASES:
        d.trigger(vmi, VirtualMachineInstancePhaseChanged, phase=obs.phase, reason=obs.reason)
    if state.phase == "Running" and obs.paused and not state.paused:
        d.trigger(vmi, VirtualMachineInstancePaused,
                  reason=obs.paused_reason or PAUSED_USER_REQUESTED)
    elif state.phase == "Running" and not obs.paused and state.paused:
        d.trigger(vmi, VirtualMachineInstanceUnpaused)
    connected = obs.agent_connected
    if state.phase == "Running" and connected is not None and connected != state.agent_connected:
        d.trigger(vmi, VirtualMachineInstanceAgentConnected, connected=connected)


def _check_addresses(interfaces: list[VirtualMachineInstanceNetworkInterface]) -> None:
    """A report's addresses are IP addresses, `ipAddress` the first of `ipAddresses`."""
    for index, interface in enumerate(interfaces):
        at = f"manifest.interfaces[{index}]"
        for n, address in enumerate(interface.ip_addresses):
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise InvalidSpec(f"{at}.ipAddresses[{n}]",
                                  f"{address!r} is not an IP address") from None
        first = interface.ip_addresses[0] if interface.ip_addresses else ""
        if interface.ip_address != first:
            raise InvalidSpec(f"{at}.ipAddress", "must be the first of ipAddresses")


@handles(KIND, "observe-interfaces", internal=True)
def observe_interfaces(d: Decision) -> None:
    """A node's report of a guest's interfaces: `status.interfaces` when they changed, while
    the guest is not finished."""
    obs = d.body(InterfacesObservation)
    _check_addresses(obs.interfaces)
    vmi = reported_vmi(d, obs.uid)
    if vmi.state.phase in TERMINAL_PHASES:
        raise Rejected("the VMI is finished: its interfaces are no longer reported")
    if obs.interfaces != vmi.state.interfaces:
        d.trigger(vmi, VirtualMachineInstanceInterfacesReported, interfaces=obs.interfaces)


# -- guest actions: the node does them, its observation confirms them ------------------------


def running_vmi(d: Decision) -> Aggregate[VirtualMachineInstanceView]:
    """The VMI a guest action targets: the VMI itself, or the VM's (which must exist)."""
    if d.command.kind == VM_KIND_NAME:
        load_vm(d)
    vmi = load_vmi(d)
    state = vmi.state
    if not vmi.exists or state.phase != "Running" or state.deletion_requested_at is not None:
        raise Rejected("VMI is not running")
    return vmi


def pause(d: Decision) -> None:
    vmi = running_vmi(d)
    if vmi.state.paused:
        raise Rejected("VMI is already paused")
    d.trigger(vmi, VirtualMachineInstanceNodeAction, action="pause")


def unpause(d: Decision) -> None:
    vmi = running_vmi(d)
    if not vmi.state.paused:
        raise Rejected("VMI is not paused")
    d.trigger(vmi, VirtualMachineInstanceNodeAction, action="unpause")


def soft_reboot(d: Decision) -> None:
    """A reboot inside the guest; unlike `restart` the VMI (and its uid) stays."""
    vmi = running_vmi(d)
    if vmi.state.paused:
        raise Rejected("VMI is paused; unpause it first")
    d.trigger(vmi, VirtualMachineInstanceNodeAction, action="restart")


for _kind in (KIND, VM_KIND_NAME):
    handles(_kind, "pause")(pause)
    handles(_kind, "unpause")(unpause)
    handles(_kind, "soft-reboot")(soft_reboot)
