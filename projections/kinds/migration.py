"""VirtualMachineInstanceMigrations as a read model: the view folded from the log, and
KubeVirt's JSON shape (`status.phase`, `phaseTransitionTimestamps`, `migrationState`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from events.api.base import ObjectMeta
from events.api.vm import API_VERSION
from events.language.codec import Event
from events.language.kinds.migration import (
    MIGRATION_KIND,
    WORKLOAD_UPDATE_KIND,
    MigrationAbortRequested,
    MigrationCreated,
    MigrationDeleted,
    MigrationPhaseChanged,
    MigrationProgressed,
    MigrationTargetScheduled,
    MigrationTargetUnschedulable,
    Priority,
    WorkloadEvictionBatch,
)
from events.language.messages import MigrationOrder
from projections.kinds.vm import MigrationState
from projections.views import View, iso, object_meta

FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})
RUNNING_PHASES: Final = frozenset({"Scheduling", "Scheduled", "PreparingTarget", "TargetReady",
                                   "Running"})
"""Admitted and not finished: what counts against the parallel-migration limits."""


class MigrationView(View, tokens=(MIGRATION_KIND,)):
    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.uid = ""
        self.metadata = ObjectMeta()
        self.vmi_name = ""
        self.vmi_uid = ""
        self.source_node = ""
        self.priority: Priority = "user"
        self.phase = ""
        self.reason = ""
        self.transitions: list[tuple[str, datetime]] = []
        self.order: MigrationOrder | None = None
        self.unschedulable_message = ""
        self.abort_requested = False
        self.mode = "PreCopy"
        self.data_total = self.data_processed = self.data_remaining = 0
        self.target_address = ""

    @property
    def target_node(self) -> str:
        return self.order.target_node if self.order is not None else ""

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    @property
    def running(self) -> bool:
        """Admitted and not finished: it holds one of the parallel-migration slots."""
        return self.exists and self.phase in RUNNING_PHASES

    def mutate(self, event: Event) -> None:
        match event:
            case MigrationCreated():
                self.exists, self.uid, self.metadata = True, event.uid, event.metadata
                self.vmi_name, self.vmi_uid = event.vmi_name, event.vmi_uid
                self.source_node, self.priority = event.source_node, event.priority
                self.created_at, self.transitions = event.timestamp, []
                self._phase("Pending", event.timestamp)
            case MigrationPhaseChanged(phase=phase, reason=reason):
                self.reason = reason
                self.target_address = event.target_address or self.target_address
                self._phase(phase, event.timestamp)
            case MigrationTargetScheduled(order=order):
                self.order, self.unschedulable_message = order, ""
                self._phase("Scheduled", event.timestamp)
            case MigrationTargetUnschedulable(message=message):
                self.unschedulable_message = message
            case MigrationProgressed():
                self.mode, self.data_total = event.mode, event.data_total
                self.data_processed, self.data_remaining = (event.data_processed,
                                                            event.data_remaining)
            case MigrationAbortRequested():
                self.abort_requested = True
            case MigrationDeleted():
                self.exists = False

    def _phase(self, phase: str, at: datetime) -> None:
        self.phase = phase
        self.transitions = [*self.transitions, (phase, at)]


class WorkloadUpdateView(View, tokens=(WORKLOAD_UPDATE_KIND,)):
    """The workload updater's eviction batches: when each was, and what it evicted."""

    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.batches: list[tuple[datetime, list[str]]] = []

    @property
    def last_batch_at(self) -> datetime | None:
        return self.batches[-1][0] if self.batches else None

    def mutate(self, event: Event) -> None:
        match event:
            case WorkloadEvictionBatch(vmis=vmis):
                self.exists = True
                self.batches = [*self.batches, (event.timestamp, list(vmis))]


def render_migration_state(state: MigrationState) -> dict[str, Any]:
    """A VMI's `status.migrationState` in KubeVirt's field names."""
    out: dict[str, Any] = {
        "migrationUid": state.migration_uid,
        "sourceNode": state.source_node,
        "targetNode": state.target_node,
        "startTimestamp": iso(state.start),
        "completed": state.completed,
        "failed": state.failed,
    }
    if state.end is not None:
        out["endTimestamp"] = iso(state.end)
    if state.failure_reason:
        out["failureReason"] = state.failure_reason
    if state.abort_status:
        out["abortStatus"] = state.abort_status
    if state.mode:
        out["mode"] = state.mode
    return out


def render_migration(view: MigrationView, vmi_state: MigrationState | None) -> dict[str, Any]:
    """The migration as KubeVirt shows it; the VMI's migrationState when it is this one's."""
    status: dict[str, Any] = {
        "phase": view.phase,
        "phaseTransitionTimestamps": [
            {"phase": phase, "phaseTransitionTimestamp": iso(at)} for phase, at in view.transitions
        ],
    }
    if view.reason:
        status["reason"] = view.reason
    if view.unschedulable_message and not view.finished:
        status["conditions"] = [{"type": "PodScheduled", "status": "False",
                                 "reason": "Unschedulable",
                                 "message": view.unschedulable_message}]
    if vmi_state is not None and vmi_state.migration_uid == view.uid:
        status["migrationState"] = render_migration_state(vmi_state)
        if view.target_address:
            status["migrationState"]["targetNodeAddress"] = view.target_address
    if view.data_total:
        status["progress"] = {"mode": view.mode, "dataTotalBytes": view.data_total,
                              "dataProcessedBytes": view.data_processed,
                              "dataRemainingBytes": view.data_remaining}
    meta = object_meta(view, view.metadata, view.uid)
    meta.setdefault("labels", {})["kubevirt.io/vmi-name"] = view.vmi_name
    return {
        "apiVersion": API_VERSION,
        "kind": "VirtualMachineInstanceMigration",
        "metadata": meta,
        "spec": {"vmiName": view.vmi_name},
        "status": status,
    }
