"""VirtualMachines, their instances and Nodes, folded from their events."""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec

from events.api.base import ObjectMeta
from events.api.node import NodeInfo
from events.api.scheduling import (
    LABEL_ARCH,
    LABEL_HOSTNAME,
    LABEL_OS,
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    TAINT_UNSCHEDULABLE,
    Taint,
)
from events.api.vm import (
    VirtualMachineInstanceNetworkInterface,
    VirtualMachineInstanceSpec,
    VirtualMachineSpec,
)
from events.language.codec import Event
from events.language.kinds.instancetype import VirtualMachineRevisionsPinned
from events.language.kinds.migration import (
    VirtualMachineInstanceEvacuationRequested,
    VirtualMachineInstanceMigrated,
    VirtualMachineInstanceMigrationFailed,
    VirtualMachineInstanceMigrationStarted,
)
from events.language.kinds.nodes import (
    NODE_KIND,
    NodeCordoned,
    NodeDrained,
    NodeDrainRequested,
    NodeInfoChanged,
    NodeLabelsChanged,
    NodeNotReady,
    NodeReady,
    NodeRegistered,
    NodeTaintsChanged,
    NodeUncordoned,
)
from events.language.kinds.vm import (
    VM_KIND,
    VMI_KIND,
    VirtualMachineCreated,
    VirtualMachineDeleted,
    VirtualMachineInstanceAdopted,
    VirtualMachineInstanceAgentConnected,
    VirtualMachineInstanceCreated,
    VirtualMachineInstanceDeleted,
    VirtualMachineInstanceDeletionRequested,
    VirtualMachineInstanceInterfacesReported,
    VirtualMachineInstancePaused,
    VirtualMachineInstancePhaseChanged,
    VirtualMachineInstanceRelabeled,
    VirtualMachineInstanceReleased,
    VirtualMachineInstanceScheduled,
    VirtualMachineInstanceUnpaused,
    VirtualMachineInstanceUnschedulable,
    VirtualMachineRestartRequested,
    VirtualMachineRunStrategyChanged,
    VirtualMachineStartFailed,
    VirtualMachineStartFailureCleared,
    VirtualMachineStartRequestDone,
    VirtualMachineStateChangeRequested,
    VirtualMachineUpdated,
)
from events.language.subjects import split_aggregate_id
from projections.views import View

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class StartFailure(msgspec.Struct, frozen=True, kw_only=True):
    """KubeVirt's status.startFailure: consecutive VMIs that finished without running."""

    last_failed_vmi_uid: str
    consecutive_fail_count: int
    retry_after: datetime


RESTARTING_STRATEGIES = frozenset({"Always", "RerunOnFailure", "Once"})
"""The run strategies whose failed starts back off (the others forget start failures)."""


class VirtualMachineView(View, tokens=(VM_KIND,)):
    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.uid = ""
        self.metadata = ObjectMeta()
        self.spec: VirtualMachineSpec | None = None
        self.generation = 0
        self.start_requested = False
        """A Start state change request no VMI has met yet."""
        self.stop_requested_uid = ""
        """The VMI the last Stop state change request stops ('' for none)."""
        self.restart_count = 0
        self.start_failure: StartFailure | None = None
        self.creations = 0
        """Times a VM of this name was created (kubevirt_vm_created_total counts them)."""

    @property
    def run_strategy(self) -> str:
        return self.spec.effective_run_strategy if self.spec else "Halted"

    @property
    def starts_without_vmi(self) -> bool:
        """Whether, with no VMI, the run strategy has one created (KubeVirt's
        `isSetToStart` with no VMI; a crash-loop backoff may still defer it)."""
        match self.run_strategy:
            case "Always" | "Once":
                return True
            case "Manual" | "RerunOnFailure":
                return self.start_requested
            case _:
                return False

    def mutate(self, event: Event) -> None:
        match event:
            case VirtualMachineCreated(uid=uid, metadata=meta, spec=spec):
                self.exists, self.uid, self.metadata, self.spec = True, uid, meta, spec
                self.created_at, self.generation = event.timestamp, 1
                self.stop_requested_uid, self.restart_count = "", 0
                self.start_failure, self.creations = None, self.creations + 1
                # KubeVirt starts a RerunOnFailure VM whose status.runStrategy differs (new).
                self.start_requested = spec.effective_run_strategy == "RerunOnFailure"
            case VirtualMachineUpdated(metadata=meta, spec=spec, generation=gen):
                rerun = spec.effective_run_strategy == "RerunOnFailure"
                if rerun and self.run_strategy != "RerunOnFailure":
                    self.start_requested = True  # switched to it: started, as when created
                self.metadata, self.spec, self.generation = meta, spec, gen
            case VirtualMachineRunStrategyChanged(run_strategy=rs, generation=gen):
                if self.spec is None:
                    self.ignore(event, "a run strategy change to a VM never created")
                    return
                self.spec = _with_run_strategy(self.spec, rs)
                self.generation = gen
            case VirtualMachineStateChangeRequested(action="Start"):
                self.start_requested, self.start_failure = True, None
            case VirtualMachineStateChangeRequested(action="Stop", uid=uid):
                self.start_requested, self.stop_requested_uid = False, uid
                self.start_failure = None
            case VirtualMachineStartRequestDone():
                self.start_requested = False
            case VirtualMachineRestartRequested(restart_count=n):
                self.restart_count, self.start_requested, self.start_failure = n, True, None
            case VirtualMachineStartFailed(vmi_uid=uid, consecutive_fail_count=count,
                                           delay_seconds=delay):
                self.start_failure = StartFailure(
                    last_failed_vmi_uid=uid, consecutive_fail_count=count,
                    retry_after=event.timestamp + timedelta(seconds=delay))
            case VirtualMachineStartFailureCleared():
                self.start_failure = None
            case VirtualMachineRevisionsPinned(instancetype_revision=it, preference_revision=pr,
                                               generation=gen):
                if self.spec is None:
                    self.ignore(event, "revisions pinned to a VM never created")
                    return
                self.spec, self.generation = self.spec.with_revisions(it, pr), gen
            case VirtualMachineDeleted():
                self.exists = False


class MigrationState(msgspec.Struct, frozen=True, kw_only=True):
    """A VMI's `status.migrationState`: its last migration, as KubeVirt shows it."""

    migration_uid: str
    migration_name: str
    source_node: str
    target_node: str
    start: datetime
    end: datetime | None = None
    completed: bool = False
    failed: bool = False
    failure_reason: str = ""
    abort_status: str = ""
    mode: str = ""

    @property
    def in_flight(self) -> bool:
        return self.end is None


def _with_run_strategy(spec: VirtualMachineSpec, run_strategy: str) -> VirtualMachineSpec:
    """`spec` switched to Always or Halted in the form its author wrote (KubeVirt's
    `getRunningPatch`): `running: true|false` where the VM uses `running`."""
    if spec.run_strategy is None and spec.running is not None:
        return msgspec.structs.replace(spec, running=run_strategy == "Always")
    return msgspec.structs.replace(spec, run_strategy=run_strategy, running=None)


class VirtualMachineInstanceView(View, tokens=(VMI_KIND,)):
    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.uid = ""
        self.metadata = ObjectMeta()
        self.spec: VirtualMachineInstanceSpec | None = None
        self.owner = ""
        self.replica_set = ""
        """The owning replica set's name, or ''."""
        self.restart_count = 0
        self.phase = ""
        self.reason = ""
        self.node = ""
        self.deletion_requested_at: datetime | None = None
        self.grace_period_seconds = 0
        self.transitions: list[tuple[str, datetime]] = []
        self.paused_reason = ""
        """Why the guest is paused (the Paused condition's reason); '' when it is not."""
        self.paused_at: datetime | None = None
        self.agent_connected_at: datetime | None = None
        """Since when the guest agent's channel is connected; None while it is not."""
        self.unschedulable_message = ""
        """Why no node fits (kube-scheduler's message) while Pending; '' otherwise."""
        self.unschedulable_at: datetime | None = None
        self.migration: MigrationState | None = None
        self.evacuation_node = ""
        """`status.evacuationNodeName`: a drain wants the VMI off that node."""
        self.launcher_version = ""
        """The agent version that launched the guest (or took it in by migration)."""
        self.interfaces: list[VirtualMachineInstanceNetworkInterface] = []
        """`status.interfaces`, as the node last reported them."""

    @property
    def migration_target(self) -> str:
        """The node a migration in flight holds resources on, besides `node`; '' if none."""
        m = self.migration
        return m.target_node if m is not None and m.in_flight else ""

    @property
    def migrating(self) -> bool:
        """A live migration of the VMI is under way (KubeVirt's `migrations.IsMigrating`)."""
        return bool(self.migration_target)

    @property
    def active(self) -> bool:
        """Holds (or is about to hold) resources on a node."""
        return self.exists and self.phase not in TERMINAL_PHASES

    @property
    def final(self) -> bool:
        """Succeeded or Failed (KubeVirt's `IsFinal`)."""
        return self.phase in TERMINAL_PHASES

    @property
    def has_run(self) -> bool:
        """Reached Running at some point (KubeVirt's `wasVMIInRunningPhase`)."""
        return any(phase == "Running" for phase, _ in self.transitions)

    @property
    def failed_early(self) -> bool:
        """Finished without ever running: a start failure (KubeVirt's `vmiFailedEarly`)."""
        return self.final and not self.has_run

    @property
    def paused(self) -> bool:
        return bool(self.paused_reason)

    def _claim(self, event: Event) -> None:
        """Labels and the replica set that claims the VMI by them."""
        match event:
            case VirtualMachineInstanceRelabeled(labels=labels):
                self.metadata = msgspec.structs.replace(self.metadata, labels=labels)
            case VirtualMachineInstanceAdopted(replica_set=replica_set):
                self.replica_set = replica_set
            case VirtualMachineInstanceReleased():
                self.replica_set = ""

    @property
    def agent_connected(self) -> bool:
        return self.agent_connected_at is not None

    def mutate(self, event: Event) -> None:
        match event:
            case VirtualMachineInstanceCreated(uid=uid, metadata=meta, spec=spec, owner=owner,
                                               restart_count=rc, replica_set=replica_set):
                self.exists, self.uid, self.metadata, self.spec = True, uid, meta, spec
                self.owner, self.restart_count, self.node, self.reason = owner, rc, "", ""
                self.replica_set = replica_set
                self.created_at, self.deletion_requested_at = event.timestamp, None
                self.transitions, self.paused_reason, self.paused_at = [], "", None
                self.agent_connected_at = None
                self.unschedulable_message, self.unschedulable_at = "", None
                self.migration, self.evacuation_node = None, ""
                self.interfaces = []
                self._phase("Pending", event.timestamp)
            case VirtualMachineInstanceUnschedulable(message=message):
                if not self.unschedulable_message:
                    self.unschedulable_at = event.timestamp
                self.unschedulable_message = message
            case VirtualMachineInstanceScheduled(node=node):
                self.node, self.unschedulable_message, self.unschedulable_at = node, "", None
                self.launcher_version = event.launcher_version
                self._phase("Scheduled", event.timestamp)
            case VirtualMachineInstancePhaseChanged(phase=phase, reason=reason):
                self.reason = reason
                self._phase(phase, event.timestamp)
                if phase in TERMINAL_PHASES:
                    self.paused_reason, self.paused_at = "", None
                    self.agent_connected_at = None
            case VirtualMachineInstancePaused(reason=reason):
                self.paused_reason, self.paused_at = reason, event.timestamp
            case VirtualMachineInstanceUnpaused():
                self.paused_reason, self.paused_at = "", None
            case (VirtualMachineInstanceRelabeled() | VirtualMachineInstanceAdopted()
                  | VirtualMachineInstanceReleased()):
                self._claim(event)
            case VirtualMachineInstanceAgentConnected(connected=connected):
                self.agent_connected_at = event.timestamp if connected else None
            case VirtualMachineInstanceInterfacesReported(interfaces=interfaces):
                self.interfaces = interfaces
            case VirtualMachineInstanceDeletionRequested(grace_period_seconds=grace):
                self.deletion_requested_at, self.grace_period_seconds = event.timestamp, grace
            case VirtualMachineInstanceDeleted():
                self.exists = False
            case (VirtualMachineInstanceMigrationStarted() | VirtualMachineInstanceMigrated()
                  | VirtualMachineInstanceMigrationFailed()):
                self._migration(event)
            case VirtualMachineInstanceEvacuationRequested(node=node):
                self.evacuation_node = node

    def _migration(self, event: Event) -> None:
        """`status.migrationState`, and the node the guest is on once it moved."""
        match event:
            case VirtualMachineInstanceMigrationStarted():
                self.migration = MigrationState(
                    migration_uid=event.migration_uid, migration_name=event.migration_name,
                    source_node=event.source_node, target_node=event.target_node,
                    start=event.timestamp)
            case VirtualMachineInstanceMigrated(node=node, mode=mode):
                if self.migration is None:
                    self.ignore(event, "a migration that never started")
                    return
                self.migration = msgspec.structs.replace(  # a failure said before it is
                    self.migration, end=event.timestamp, completed=True, mode=mode,  # undone
                    failed=False, failure_reason="",
                    abort_status="Failed" if event.aborting_failed else "")
                self.node, self.evacuation_node = node, ""
                self.launcher_version = event.launcher_version
            case VirtualMachineInstanceMigrationFailed(reason=reason, aborted=aborted):
                if self.migration is None:
                    self.ignore(event, "a migration that never started")
                    return
                self.migration = msgspec.structs.replace(
                    self.migration, end=event.timestamp, failed=True, failure_reason=reason,
                    abort_status="Succeeded" if aborted else "")

    def _phase(self, phase: str, at: datetime) -> None:
        self.phase = phase
        self.transitions = [*self.transitions, (phase, at)]


class NodeView(View, tokens=(NODE_KIND,)):
    """A node: what its agent reports (`info`, discovery labels included), what operators set
    (`labels`, `taints`, `unschedulable`), and its readiness."""

    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.info: NodeInfo | None = None
        self.ready = False
        self.reason = ""
        self.transition_at: datetime | None = None
        self.labels: dict[str, str] = {}
        """The operator's labels (`label node`); they outlive the agent registering again."""
        self.taints: list[Taint] = []
        self.unschedulable = False
        self.draining = False
        """A drain is under way (from `drain` until it ends or the node is uncordoned)."""

    @property
    def name(self) -> str:
        """The node's name (decoded: a host's FQDN is not a subject token as it stands)."""
        return split_aggregate_id(self.id)[2]

    @property
    def emulation(self) -> bool:
        """Whether the host runs guests without KVM, which changes what a VMI holds on it."""
        return self.info is not None and self.info.domain_type != "kvm"

    @property
    def all_labels(self) -> dict[str, str]:
        """The node's labels as Kubernetes shows them: the kubelet's well-known ones, the
        agent's discovery, then the operator's (which win)."""
        info = self.info
        well_known = {LABEL_HOSTNAME: self.name, LABEL_OS: "linux"}
        if info is None:
            return {**well_known, **self.labels}
        return {**well_known, LABEL_ARCH: _go_arch(info.architecture), **info.labels,
                **self.labels}

    @property
    def all_taints(self) -> list[Taint]:
        """The operator's taints and those Kubernetes derives from the node's conditions
        (TaintNodesByCondition): not-ready or unreachable, and unschedulable when cordoned."""
        derived: list[Taint] = []
        if self.unschedulable:
            derived.append(Taint(key=TAINT_UNSCHEDULABLE, effect="NoSchedule"))
        if not self.ready:
            key = TAINT_UNREACHABLE if self.reason == "NodeStatusUnknown" else TAINT_NOT_READY
            derived += [Taint(key=key, effect="NoSchedule"), Taint(key=key, effect="NoExecute")]
        return [*self.taints, *derived]

    def mutate(self, event: Event) -> None:
        match event:
            case NodeRegistered(info=info):
                self.exists, self.info, self.created_at = True, info, event.timestamp
            case NodeInfoChanged(info=info):
                self.info = info
            case NodeReady():
                self.ready, self.reason, self.transition_at = True, "", event.timestamp
            case NodeNotReady(reason=reason):
                self.ready, self.reason, self.transition_at = False, reason, event.timestamp
            case NodeLabelsChanged(labels=labels):
                self.labels = labels
            case NodeTaintsChanged(taints=taints):
                self.taints = taints
            case NodeCordoned():
                self.unschedulable = True
            case NodeUncordoned():
                self.unschedulable, self.draining = False, False
            case NodeDrainRequested():
                self.unschedulable, self.draining = True, True
            case NodeDrained():
                self.draining = False


_GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


def _go_arch(architecture: str) -> str:
    """libvirt's architecture as Go (and so `kubernetes.io/arch`) names it."""
    return _GO_ARCH.get(architecture, architecture)


