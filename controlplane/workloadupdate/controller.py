"""The workload updater: moves the VMIs an older agent launched (`kubevirt.io/
outdatedLauncherImage`) by the workload update strategy.

| outdated VMI                    | methods hold      | action                              |
|---------------------------------|-------------------|-------------------------------------|
| can live-migrate                | LiveMigrate       | a migration (lowest priority: after |
|                                 |                   | evacuations and users' migrations)  |
| cannot, or LiveMigrate not held | Evict             | evicted in a batch of at most       |
|                                 |                   | batchEvictionSize, one batch every  |
|                                 |                   | batchEvictionInterval               |
| any                             | nothing (`[]`)    | nothing                             |

Migrations follow the log (level-triggered on every change); batches follow the clock too,
so `tick` runs on the control loop's period. A batch's command id is derived from the number
of batches before it: deciding the same batch twice is one batch.
"""

from __future__ import annotations

from datetime import datetime

from controlplane.clusterconfig import ClusterConfig, WorkloadUpdateConfig
from controlplane.controllers import derived_command
from events.language.codec import Event
from events.language.kinds.migration import MIGRATION_KIND
from events.language.kinds.nodes import NODE_KIND
from events.language.kinds.vm import VMI_KIND
from events.language.messages import Command
from events.language.subjects import split_aggregate_id
from projections.cluster import ClusterState, outdated_launcher
from projections.eviction import migrating
from projections.kinds.hco import HCO_TOKENS
from projections.kinds.migration import MigrationView, WorkloadUpdateView
from projections.kinds.vm import VirtualMachineInstanceView
from projections.migratable import not_migratable

NAME = "workload-updater"


def outdated(state: ClusterState) -> list[VirtualMachineInstanceView]:
    return sorted((v for v in state.vmis() if outdated_launcher(state, v)
                   and v.deletion_requested_at is None), key=lambda v: v.id)


class WorkloadUpdater:
    name = NAME

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        """A node's new agent version or a new strategy concerns every VMI; a VMI's or its
        migration's change, that VMI only."""
        kind, namespace, name = split_aggregate_id(event.originator_id)
        if kind == NODE_KIND or kind in HCO_TOKENS:
            return self.resync(state)
        if kind == MIGRATION_KIND:
            migration = state.views.get(event.originator_id)
            name = migration.vmi_name if isinstance(migration, MigrationView) else ""
        elif kind != VMI_KIND:
            return []
        vmi = state.vmi(namespace, name) if name else None
        if vmi is None or not outdated_launcher(state, vmi):
            return []
        return self._migrations(state, [vmi])

    def resync(self, state: ClusterState) -> list[Command]:
        return self._migrations(state, outdated(state))

    def _migrations(self, state: ClusterState,
                    vmis: list[VirtualMachineInstanceView]) -> list[Command]:
        """A migration for each outdated VMI that can move, when LiveMigrate is a method."""
        methods = self._config(state).methods
        if "LiveMigrate" not in methods:
            return []
        return [derived_command(NAME, "VirtualMachineInstanceMigration",
                                "create-for-workload-update", v.metadata.namespace,
                                v.metadata.name, v.uid, v.version,
                                manifest={"vmi_name": v.metadata.name, "node": v.node})
                for v in vmis if v.deletion_requested_at is None and self._can_migrate(v)
                and not migrating(state, v)]

    def tick(self, state: ClusterState, now: datetime) -> list[Command]:
        """The next eviction batch, once the interval since the last one has passed."""
        config = self._config(state)
        if "Evict" not in config.methods:
            return []
        live_migrate = "LiveMigrate" in config.methods
        due = [v for v in outdated(state)
               if not (live_migrate and self._can_migrate(v)) and not migrating(state, v)]
        if not due:
            return []
        updater = next((v for v in state.views.values() if isinstance(v, WorkloadUpdateView)),
                       None)
        batches = len(updater.batches) if updater is not None else 0
        last = updater.last_batch_at if updater is not None else None
        if last is not None and now - last < config.interval:
            return []
        batch = [f"{v.metadata.namespace}/{v.metadata.name}" for v in due[:config.batch_size]]
        return [derived_command(NAME, "WorkloadUpdate", "evict-batch", "", "cluster", batches,
                                manifest={"vmis": batch})]

    @staticmethod
    def _config(state: ClusterState) -> WorkloadUpdateConfig:
        return ClusterConfig.of_state(state).workload_updates

    @staticmethod
    def _can_migrate(vmi: VirtualMachineInstanceView) -> bool:
        return vmi.spec is not None and not_migratable(vmi.spec, vmi.metadata.annotations) is None
