"""The whole cluster as a read model: every view, routed by aggregate id, and rendered in
KubeVirt's JSON shape with `status`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any, TypeVar

import msgspec

from events.api.resources import DEFAULT_TUNING, ClusterTuning, vmi_resources
from events.api.vm import API_VERSION
from events.codec import Event
from events.nodes import NODE_KIND
from events.subjects import aggregate_id
from events.vm import PAUSED_MESSAGES, VM_KIND, VMI_KIND
from projections.hco import HCO_VIEW_KINDS
from projections.instancetype import INSTANCETYPE_VIEW_KINDS, revision_refs
from projections.views import (
    NodeView,
    View,
    VirtualMachineInstanceView,
    VirtualMachineView,
    iso,
    object_meta,
)

V = TypeVar("V", bound=View)

VIEW_KINDS: dict[str, type[View]] = {
    VM_KIND: VirtualMachineView,
    VMI_KIND: VirtualMachineInstanceView,
    NODE_KIND: NodeView,
    **HCO_VIEW_KINDS,
    **INSTANCETYPE_VIEW_KINDS,
}


class ClusterState:
    """Every object's view; `apply` is idempotent per aggregate version."""

    def __init__(self) -> None:
        self.views: dict[str, View] = {}
        self.last_sequence = 0
        self.skipped: Counter[str] = Counter()
        """Messages of the log this version could not decode, by reason (see
        `projections.follower.SKIP_REASONS`): folded like the views, so the same log and code
        give the same counts (`virtbus_events_skipped_total`)."""

    def skip(self, sequence: int, reason: str) -> None:
        """A message at `sequence` that is not an event this version can read: counted, and
        the state has read past it."""
        self.skipped[reason] += 1
        self.last_sequence = max(self.last_sequence, sequence)

    def apply(self, event: Event, sequence: int = 0) -> View | None:
        kind = event.originator_id.split(".", 1)[0]
        view_cls = VIEW_KINDS.get(kind)
        self.last_sequence = max(self.last_sequence, sequence)
        if view_cls is None:
            return None
        view = self.views.get(event.originator_id)
        if view is None:
            view = self.views[event.originator_id] = view_cls(event.originator_id)
        view.apply(event, sequence)
        return view

    def is_next(self, event: Event) -> bool:
        """Whether `event` is the very next version of its object: folding it ahead of the
        log then skips nothing (an event of a later version would hide an earlier one
        not folded yet, which `apply` then drops as already seen)."""
        view = self.views.get(event.originator_id)
        return event.originator_version == (view.version if view is not None else 0) + 1

    def _get(self, cls: type[V], agg_id: str) -> V | None:
        view = self.views.get(agg_id)
        return view if isinstance(view, cls) and view.exists else None

    def vm(self, namespace: str, name: str) -> VirtualMachineView | None:
        return self._get(VirtualMachineView, aggregate_id(VM_KIND, namespace, name))

    def vmi(self, namespace: str, name: str) -> VirtualMachineInstanceView | None:
        return self._get(VirtualMachineInstanceView, aggregate_id(VMI_KIND, namespace, name))

    def node(self, name: str) -> NodeView | None:
        return self._get(NodeView, aggregate_id(NODE_KIND, "", name))

    def _all(self, cls: type[V]) -> Iterator[V]:
        for view in self.views.values():
            if isinstance(view, cls) and view.exists:
                yield view

    def vms(self) -> Iterator[VirtualMachineView]:
        return self._all(VirtualMachineView)

    def vmis(self) -> Iterator[VirtualMachineInstanceView]:
        return self._all(VirtualMachineInstanceView)

    def nodes(self) -> Iterator[NodeView]:
        return self._all(NodeView)

    def vmis_on(self, node: str) -> list[VirtualMachineInstanceView]:
        return [v for v in self.vmis() if v.node == node and v.active]

    def node_usage(self, node: str, *, emulation: bool = False,
                   tuning: ClusterTuning = DEFAULT_TUNING) -> dict[str, int]:
        """What the active VMIs on a node hold: memory bytes (with overhead), CPU millicores,
        and extended resources (kvm/tun devices, hugepages)."""
        usage: dict[str, int] = {"memory": 0, "cpu": 0, "vmis": 0}
        for vmi in self.vmis_on(node):
            if vmi.spec is None:  # an instance without a spec asks for nothing
                continue
            ask = vmi_resources(vmi.spec.domain, emulation=emulation, tuning=tuning)
            usage["memory"] += ask.memory_bytes
            usage["cpu"] += ask.cpu_millis
            usage["vmis"] += 1
            for name, amount in ask.extended.items():
                usage[name] = usage.get(name, 0) + amount
        return usage


# -- rendering in KubeVirt's shape -----------------------------------------------------------


def printable_status(vm: VirtualMachineView, vmi: VirtualMachineInstanceView | None) -> str:
    """KubeVirt's VirtualMachine printableStatus, for the states virtbus models."""
    if vmi is None:
        return "Stopped"
    if vmi.deletion_requested_at is not None:
        return "Stopping" if vm.exists else "Terminating"
    match vmi.phase:
        case "Pending" if vmi.unschedulable_message:
            return "ErrorUnschedulable"
        case "Pending" | "Scheduling":
            return "Provisioning" if not vmi.node else "Starting"
        case "Scheduled":
            return "Starting"
        case "Running":
            return "Paused" if vmi.paused else "Running"
        case "Succeeded":
            return "Stopped"
        case "Failed":
            return "CrashLoopBackOff" if vm.run_strategy == "Always" else "Stopped"
        case _:
            return "Unknown"


def paused_condition(vmi: VirtualMachineInstanceView | None) -> list[dict[str, Any]]:
    """KubeVirt's `Paused` condition, on the VMI and copied to its VM, while it is paused."""
    if vmi is None or not vmi.paused:
        return []
    return [{"type": "Paused", "status": "True", "reason": vmi.paused_reason,
             "message": PAUSED_MESSAGES.get(vmi.paused_reason, ""), "lastProbeTime": None,
             "lastTransitionTime": iso(vmi.paused_at)}]


def pod_scheduled_condition(vmi: VirtualMachineInstanceView) -> list[dict[str, Any]]:
    """KubeVirt's copy of its launcher pod's `PodScheduled` condition, while no node fits."""
    if not vmi.unschedulable_message:
        return []
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": vmi.unschedulable_message, "lastProbeTime": None,
             "lastTransitionTime": iso(vmi.unschedulable_at)}]


def render_vm(vm: VirtualMachineView, vmi: VirtualMachineInstanceView | None) -> dict[str, Any]:
    ready = vmi is not None and vmi.phase == "Running" and vmi.deletion_requested_at is None
    status: dict[str, Any] = {
        "printableStatus": printable_status(vm, vmi),
        "ready": ready,
        "created": vmi is not None,
        "runStrategy": vm.run_strategy,
        "observedGeneration": vm.generation,
        "desiredGeneration": vm.generation,
        "conditions": [{
            "type": "Ready",
            "status": "True" if ready else "False",
            "lastTransitionTime": iso(vmi.updated_at if vmi else vm.updated_at),
        }, *paused_condition(vmi)],
    }
    if vm.run_strategy == "Manual" and vm.manual_running:
        status["stateChangeRequests"] = []
    if vm.restart_count:
        status["restartCount"] = vm.restart_count
    if vm.spec is not None:
        status.update(revision_refs(vm.spec))
    return {
        "apiVersion": API_VERSION,
        "kind": "VirtualMachine",
        "metadata": object_meta(vm, vm.metadata, vm.uid, vm.generation),
        "spec": msgspec.to_builtins(vm.spec) if vm.spec is not None else {},
        "status": status,
    }


def render_vmi(vmi: VirtualMachineInstanceView) -> dict[str, Any]:
    meta = object_meta(vmi, vmi.metadata, vmi.uid)
    if vmi.owner:
        meta["ownerReferences"] = [{
            "apiVersion": API_VERSION, "kind": "VirtualMachine", "name": vmi.owner,
            "controller": True, "blockOwnerDeletion": True,
        }]
    if vmi.deletion_requested_at is not None:
        meta["deletionTimestamp"] = iso(vmi.deletion_requested_at)
        meta["deletionGracePeriodSeconds"] = vmi.grace_period_seconds
    status: dict[str, Any] = {
        "phase": vmi.phase,
        "phaseTransitionTimestamps": [
            {"phase": phase, "phaseTransitionTimestamp": iso(at)} for phase, at in vmi.transitions
        ],
        "conditions": [{
            "type": "Ready",
            "status": "True" if vmi.phase == "Running" else "False",
            "lastTransitionTime": iso(vmi.updated_at),
        }, *paused_condition(vmi), *pod_scheduled_condition(vmi)],
    }
    if vmi.node:
        status["nodeName"] = vmi.node
    if vmi.reason:
        status["reason"] = vmi.reason
    return {
        "apiVersion": API_VERSION,
        "kind": "VirtualMachineInstance",
        "metadata": meta,
        "spec": msgspec.to_builtins(vmi.spec) if vmi.spec is not None else {},
        "status": status,
    }


def render_node(node: NodeView, usage: dict[str, int]) -> dict[str, Any]:
    info = node.info
    status: dict[str, Any] = {
        "conditions": [{
            "type": "Ready",
            "status": "True" if node.ready else "False",
            "reason": "KubeletReady" if node.ready else (node.reason or "NodeStatusUnknown"),
            "lastTransitionTime": iso(node.transition_at),
        }],
        "allocated": {
            **{k: str(v) for k, v in usage.items() if k not in ("cpu", "vmis")},
            "cpu": f"{usage['cpu']}m",
            "vmis": str(usage["vmis"]),
        },
    }
    if info is not None:
        status["capacity"] = dict(info.capacity)
        status["allocatable"] = dict(info.allocatable)
        status["nodeInfo"] = {
            "architecture": info.architecture, "hypervisorURI": info.hypervisor_uri,
            "domainType": info.domain_type, "libvirtVersion": info.libvirt_version,
            "hostname": info.hostname,
        }
    spec: dict[str, Any] = {}
    if node.unschedulable:
        spec["unschedulable"] = True
    if taints := node.all_taints:
        spec["taints"] = msgspec.to_builtins(taints)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "spec": spec,
        "metadata": {"name": node.name, "labels": node.all_labels,
                     "resourceVersion": str(node.last_sequence),
                     "creationTimestamp": iso(node.created_at)},
        "status": status,
    }
