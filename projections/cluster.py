"""The whole cluster as a read model: every view, routed by aggregate id, and rendered in
KubeVirt's JSON shape with `status`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import msgspec

from events.api.replicaset import REPLICA_SET
from events.api.resources import DEFAULT_TUNING, ClusterTuning, vmi_resources
from events.api.unsupported import NOT_HONOURED_CONDITION, NOT_HONOURED_REASON, inert_fields
from events.api.vm import API_VERSION
from events.language.codec import Event
from events.language.kinds.nodes import NODE_KIND
from events.language.kinds.replicaset import REPLICA_SET_KIND
from events.language.kinds.vm import PAUSED_MESSAGES, VM_KIND, VMI_KIND
from events.language.subjects import aggregate_id
from projections.kinds import FOLDS, fold_of
from projections.kinds.instancetype import revision_refs
from projections.kinds.migration import MigrationView, render_migration_state
from projections.kinds.replicaset import PresetView, ReplicaSetView
from projections.kinds.vm import (
    RESTARTING_STRATEGIES,
    NodeView,
    VirtualMachineInstanceView,
    VirtualMachineView,
)
from projections.migratable import not_migratable
from projections.views import View, iso, object_meta

V = TypeVar("V", bound=View)

class ClusterState:
    """Every object's view; `apply` is idempotent per aggregate version."""

    def __init__(self) -> None:
        self.views: dict[str, View] = {}
        self._by_class: dict[type[View], list[View]] = {}
        self._indexed: tuple[int, int] = (0, 0)
        """`id` and length of the `views` dict `_by_class` lists: views are only ever added
        (a deleted object keeps its view), so a different dict (a snapshot restored) or a
        different length means the index must be built again."""
        self.observers: list[Callable[[View], None]] = []
        """Told of each view just after an event changed it (a controller that folds what
        it needs as the read model does, instead of reading every view again)."""
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
        view_cls = FOLDS.get(kind) or fold_of(kind)
        self.last_sequence = max(self.last_sequence, sequence)
        if view_cls is None:
            return None
        view = self.views.get(event.originator_id)
        if view is None:
            current = self._indexed == (id(self.views), len(self.views))
            view = self.views[event.originator_id] = view_cls(event.originator_id)
            if current:  # keep the index up to date rather than build it again
                self._by_class.setdefault(view_cls, []).append(view)
                self._indexed = (id(self.views), len(self.views))
        if view.apply(event, sequence):
            for observer in self.observers:
                observer(view)
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
        """Every existing view of `cls`, without looking at the views of other kinds."""
        return (view for view in self._ever(cls) if view.exists)

    def _ever(self, cls: type[V]) -> Iterator[V]:
        """Every view of `cls`, deleted ones too, without looking at the views of other
        kinds."""
        if self._indexed != (id(self.views), len(self.views)):
            self._by_class = {}
            for view in self.views.values():
                self._by_class.setdefault(type(view), []).append(view)
            self._indexed = (id(self.views), len(self.views))
        for view_cls, views in list(self._by_class.items()):
            if issubclass(view_cls, cls):
                yield from views  # type: ignore[misc]

    def of_token(self, token: str) -> Iterator[View]:
        """Every existing object whose aggregate carries `token` (one declared kind's),
        without looking at the views of other classes."""
        fold = fold_of(token)
        prefix = token + "."
        return (view for view in self._all(fold) if view.id.startswith(prefix)) \
            if fold is not None else iter(())

    def vms(self) -> Iterator[VirtualMachineView]:
        return self._all(VirtualMachineView)

    def vmis(self) -> Iterator[VirtualMachineInstanceView]:
        return self._all(VirtualMachineInstanceView)

    def nodes(self) -> Iterator[NodeView]:
        return self._all(NodeView)

    def migrations(self) -> Iterator[MigrationView]:
        return self._all(MigrationView)

    def replica_set(self, namespace: str, name: str) -> ReplicaSetView | None:
        return self._get(ReplicaSetView, aggregate_id(REPLICA_SET_KIND, namespace, name))

    def replica_sets(self) -> Iterator[ReplicaSetView]:
        return self._all(ReplicaSetView)

    def presets(self) -> Iterator[PresetView]:
        return self._all(PresetView)

    def presets_seen(self, namespace: str) -> int:
        """The newest sequence of any preset of `namespace`, deleted ones too: what creating
        a VMI there reads, so a controller's creation decided again after a preset changed
        is a new command."""
        return max((v.last_sequence for v in self._ever(PresetView)
                    if v.metadata.namespace == namespace), default=0)

    def replicas(self, namespace: str, name: str) -> list[VirtualMachineInstanceView]:
        """The replica set's active VMIs (KubeVirt's `filterActiveVMIs`: not final, not being
        deleted), which it counts as `status.replicas`."""
        return [v for v in self.vmis() if v.replica_set == name
                and v.metadata.namespace == namespace and not v.final
                and v.deletion_requested_at is None]

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


STARTING_PHASES = frozenset({"", "Pending", "Scheduling", "Scheduled"})
PrintablePredicate = Callable[[VirtualMachineView, VirtualMachineInstanceView | None], bool]


def _crash_loop_back_off(vm: VirtualMachineView, vmi: VirtualMachineInstanceView | None) -> bool:
    return ((vmi is None or vmi.final) and vm.start_failure is not None
            and vm.start_failure.consecutive_fail_count > 0
            and vm.run_strategy in RESTARTING_STRATEGIES)


PRINTABLE_STATUSES: tuple[tuple[str, PrintablePredicate], ...] = (
    ("Terminating", lambda vm, vmi: not vm.exists),
    ("Stopping", lambda vm, vmi: vmi is not None and not vmi.final
     and vmi.deletion_requested_at is not None),
    ("Migrating", lambda vm, vmi: vmi is not None and vmi.migrating),
    ("Paused", lambda vm, vmi: vmi is not None and vmi.phase == "Running" and vmi.paused),
    ("Running", lambda vm, vmi: vmi is not None and vmi.phase == "Running" and not vmi.paused),
    ("ErrorUnschedulable", lambda vm, vmi: vmi is not None and bool(vmi.unschedulable_message)),
    ("Starting", lambda vm, vmi: vmi is not None and vmi.phase in STARTING_PHASES),
    ("CrashLoopBackOff", _crash_loop_back_off),
    ("Stopped", lambda vm, vmi: vmi is None or vmi.final),
)
"""KubeVirt's `setPrintableStatus`, first match wins, in its order:

| printableStatus         | when                                              | in virtbus       |
|-------------------------|---------------------------------------------------|------------------|
| Terminating             | the VM is being deleted                           | never: a VM is   |
|                         |                                                   | deleted at once  |
| Stopping                | the VMI, not final, is being deleted              | yes              |
| Migrating               | the VMI is migrating                              | `migrating`      |
| Paused                  | VMI Running with the Paused condition             | yes              |
| Running                 | VMI Running, not paused                           | yes              |
| ErrorPvcNotFound        | VMI Synchronized=False FailedPvcNotFound          | never: no PVCs   |
| DataVolumeError         | a DataVolume of the VM failed                     | never: no DVs    |
| ErrorUnschedulable      | VMI PodScheduled=False Unschedulable              | yes              |
| Provisioning            | a DataVolume of the VM is being provisioned       | never: no DVs    |
| WaitingForVolumeBinding | set to start, a PVC unbound                       | never: no PVCs   |
| ErrImagePull            | VMI Synchronized=False ErrImagePull               | never: no pulls  |
| ImagePullBackOff        | VMI Synchronized=False ImagePullBackOff           | never: no pulls  |
| Starting                | VMI Pending / Scheduling / Scheduled              | yes              |
| CrashLoopBackOff        | no VMI or a final one, start failures counted,    | yes              |
|                         | Always / RerunOnFailure / Once                    |                  |
| Stopped                 | no VMI, or a final one                            | yes              |
| Unknown                 | none of the above                                 | unreachable      |

The rows marked never have no predicate here: virtbus has no PVCs, DataVolumes or image
pulls to ask about."""


def printable_status(vm: VirtualMachineView, vmi: VirtualMachineInstanceView | None) -> str:
    """KubeVirt's VirtualMachine printableStatus (see `PRINTABLE_STATUSES`)."""
    for status, holds in PRINTABLE_STATUSES:
        if holds(vm, vmi):
            return status
    return "Unknown"


def paused_condition(vmi: VirtualMachineInstanceView | None) -> list[dict[str, Any]]:
    """KubeVirt's `Paused` condition, on the VMI and copied to its VM, while it is paused."""
    if vmi is None or not vmi.paused:
        return []
    return [{"type": "Paused", "status": "True", "reason": vmi.paused_reason,
             "message": PAUSED_MESSAGES.get(vmi.paused_reason, ""), "lastProbeTime": None,
             "lastTransitionTime": iso(vmi.paused_at)}]


def agent_connected_condition(vmi: VirtualMachineInstanceView) -> list[dict[str, Any]]:
    """KubeVirt's `AgentConnected` condition, while the QEMU guest agent's channel is
    connected."""
    if vmi.agent_connected_at is None:
        return []
    return [{"type": "AgentConnected", "status": "True", "lastProbeTime": None,
             "lastTransitionTime": iso(vmi.agent_connected_at)}]


def pod_scheduled_condition(vmi: VirtualMachineInstanceView) -> list[dict[str, Any]]:
    """KubeVirt's copy of its launcher pod's `PodScheduled` condition, while no node fits."""
    if not vmi.unschedulable_message:
        return []
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": vmi.unschedulable_message, "lastProbeTime": None,
             "lastTransitionTime": iso(vmi.unschedulable_at)}]


def live_migratable_condition(vmi: VirtualMachineInstanceView) -> list[dict[str, Any]]:
    """KubeVirt's `LiveMigratable` condition, True or False with the reason."""
    if vmi.spec is None:
        return []
    refused = not_migratable(vmi.spec, vmi.metadata.annotations)
    if refused is None:
        return [{"type": "LiveMigratable", "status": "True", "lastProbeTime": None,
                 "lastTransitionTime": None}]
    return [{"type": "LiveMigratable", "status": "False", "lastProbeTime": None,
             "lastTransitionTime": None, "reason": refused.reason, "message": refused.message}]


def spec_honoured_condition(vmi: VirtualMachineInstanceView) -> list[dict[str, Any]]:
    """`SpecHonoured` False while the spec asks for what a virtbus guest goes without
    (`events.api.unsupported`): accepted as KubeVirt accepts it, and said, not dropped."""
    inert = list(inert_fields(vmi.spec, vmi.metadata.annotations)) \
        if vmi.spec is not None else []
    if not inert:
        return []
    return [{"type": NOT_HONOURED_CONDITION, "status": "False", "reason": NOT_HONOURED_REASON,
             "message": "; ".join(inert), "lastProbeTime": None,
             "lastTransitionTime": iso(vmi.created_at)}]


def pending_state_changes(vm: VirtualMachineView,
                          vmi: VirtualMachineInstanceView | None) -> list[dict[str, str]]:
    """status.stateChangeRequests: a Stop of the VMI still there, a Start no VMI has met."""
    requests = []
    if vmi is not None and vm.stop_requested_uid == vmi.uid:
        requests.append({"action": "Stop", "uid": vmi.uid})
    if vm.start_requested:
        requests.append({"action": "Start"})
    return requests


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
    if requests := pending_state_changes(vm, vmi):
        status["stateChangeRequests"] = requests
    if vm.start_failure is not None:
        failure = vm.start_failure
        status["startFailure"] = {
            "consecutiveFailCount": failure.consecutive_fail_count,
            "lastFailedVMIUID": failure.last_failed_vmi_uid,
            "retryAfterTimestamp": iso(failure.retry_after),
        }
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


OUTDATED_LAUNCHER_LABEL = "kubevirt.io/outdatedLauncherImage"


def outdated_launcher(state: ClusterState, vmi: VirtualMachineInstanceView) -> bool:
    """The guest runs under an agent version its node no longer has (an upgrade rolled out
    since it was launched), as KubeVirt marks a VMI whose launcher image is old."""
    node = state.node(vmi.node) if vmi.node and vmi.active else None
    if node is None or node.info is None or not node.info.agent_version:
        return False
    return vmi.launcher_version != node.info.agent_version


def render_vmi(vmi: VirtualMachineInstanceView, *, outdated: bool = False) -> dict[str, Any]:
    meta = object_meta(vmi, vmi.metadata, vmi.uid)
    if outdated:
        meta["labels"] = {**meta.get("labels", {}), OUTDATED_LAUNCHER_LABEL: ""}
    if vmi.owner or vmi.replica_set:
        meta["ownerReferences"] = [{
            "apiVersion": API_VERSION, "name": vmi.owner or vmi.replica_set,
            "kind": "VirtualMachine" if vmi.owner else REPLICA_SET,
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
        }, *paused_condition(vmi), *agent_connected_condition(vmi),
            *pod_scheduled_condition(vmi), *live_migratable_condition(vmi),
            *spec_honoured_condition(vmi)],
    }
    if vmi.node:
        status["nodeName"] = vmi.node
    if vmi.migration is not None:
        status["migrationState"] = render_migration_state(vmi.migration)
    if vmi.evacuation_node:
        status["evacuationNodeName"] = vmi.evacuation_node
    if vmi.interfaces:
        status["interfaces"] = msgspec.to_builtins(vmi.interfaces)
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
