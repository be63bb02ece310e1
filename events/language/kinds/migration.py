"""Events of VirtualMachineInstanceMigrations, and of a VMI's migration state.

A migration's aggregate id is `vmim.<namespace>.<name>`. Every phase KubeVirt has is an
event; the step that moves the guest (Succeeded) is appended with the VMI's
`VirtualMachineInstanceMigrated` in one atomic batch, so the log never shows a migration
that succeeded and a VMI still on its source, nor the reverse.
"""

from __future__ import annotations

from typing import Final, Literal

from events.api.base import ObjectMeta
from events.api.migration import VIRTUAL_MACHINE_INSTANCE_MIGRATION
from events.language.codec import Event, event_type
from events.language.messages import MigrationAddress, MigrationMode, MigrationOrder

MIGRATION_KIND: Final = VIRTUAL_MACHINE_INSTANCE_MIGRATION.token

MigrationPhase = Literal["Pending", "Scheduling", "Scheduled", "PreparingTarget", "TargetReady",
                         "Running", "Succeeded", "Failed"]
Priority = Literal["evacuation", "user", "workload-update"]
"""Who asked, in the order free slots go (KubeVirt's migration priority queue)."""
PRIORITIES: Final[tuple[Priority, ...]] = ("evacuation", "user", "workload-update")
AbortStatus = Literal["", "Aborting", "Succeeded", "Failed"]


@event_type("MigrationCreated")
class MigrationCreated(Event, frozen=True, kw_only=True):
    """A migration of VMI `vmi_name` (the instance `vmi_uid` running on `source_node`)."""

    uid: str
    metadata: ObjectMeta
    vmi_name: str
    vmi_uid: str
    source_node: str
    priority: Priority = "user"


@event_type("MigrationPhaseChanged")
class MigrationPhaseChanged(Event, frozen=True, kw_only=True):
    phase: MigrationPhase
    reason: str = ""
    target_address: MigrationAddress = ""
    """To TargetReady: where the target's agent said it listens (a real hypervisor's)."""


@event_type("MigrationTargetScheduled")
class MigrationTargetScheduled(Event, frozen=True, kw_only=True):
    """The scheduler's target (phase Scheduled), and the limits the agents will keep, taken
    from the effective configuration now."""

    order: MigrationOrder


@event_type("MigrationTargetUnschedulable")
class MigrationTargetUnschedulable(Event, frozen=True, kw_only=True):
    """No node but the source fits: kube-scheduler's message; only when it changes."""

    message: str


@event_type("MigrationProgressed")
class MigrationProgressed(Event, frozen=True, kw_only=True):
    mode: MigrationMode
    data_total: int
    data_processed: int
    data_remaining: int


@event_type("MigrationAbortRequested")
class MigrationAbortRequested(Event, frozen=True, kw_only=True):
    """`migrate-cancel` (or the migration deleted) while the source may be transferring."""


@event_type("MigrationDeleted")
class MigrationDeleted(Event, frozen=True, kw_only=True):
    pass


@event_type("VirtualMachineInstanceMigrationStarted")
class VirtualMachineInstanceMigrationStarted(Event, frozen=True, kw_only=True):
    """The VMI's `status.migrationState` begins: its target holds resources from now on."""

    migration_uid: str
    migration_name: str
    source_node: str
    target_node: str


@event_type("VirtualMachineInstanceMigrated")
class VirtualMachineInstanceMigrated(Event, frozen=True, kw_only=True):
    """The guest runs on `node` now (the migration's target): `status.nodeName` changes."""

    node: str
    launcher_version: str = ""
    """The target's agent version: the guest runs under it from now on."""
    mode: MigrationMode = "PreCopy"
    aborting_failed: bool = False
    """An abort had been asked for and came too late."""


@event_type("VirtualMachineInstanceMigrationFailed")
class VirtualMachineInstanceMigrationFailed(Event, frozen=True, kw_only=True):
    """The guest stays where it was; `aborted`: because someone asked."""

    reason: str
    aborted: bool = False


WORKLOAD_UPDATE_KIND: Final = "workloadupdate"
"""The workload updater's own aggregate (`workloadupdate..cluster`): its eviction batches."""


@event_type("WorkloadEvictionBatch")
class WorkloadEvictionBatch(Event, frozen=True, kw_only=True):
    """One batch of the workload update strategy's `Evict`: the VMIs (`namespace/name`)
    evicted together, their deletions in the same atomic append."""

    vmis: list[str]


@event_type("VirtualMachineInstanceEvacuationRequested")
class VirtualMachineInstanceEvacuationRequested(Event, frozen=True, kw_only=True):
    """A drain wants the VMI off `node` (`status.evacuationNodeName`)."""

    node: str
