"""VirtualMachineInstanceMigration commands: from users (`apply` of a migration, `migrate` and
`migrate-cancel` of a VM or VMI, as virtctl has them, `delete`), from the migration and
evacuation controllers (`create-for-evacuation`, `admit`, `schedule-target`,
`target-unschedulable`, `fail`) and from the agents' reports (`observe`).

| phase           | what moves it on                      | to                            |
|-----------------|---------------------------------------|-------------------------------|
| Pending         | `admit`: a slot free under both limits| Scheduling                    |
| Scheduling      | `schedule-target`: a node fits        | Scheduled, PreparingTarget    |
| PreparingTarget | the target reports `target-ready`     | TargetReady                   |
| TargetReady     | the source reports `running`          | Running                       |
| TargetReady,    | the source reports `converged`        | Succeeded, and the VMI's      |
| Running         |                                       | nodeName = target (one batch) |
| any unfinished  | a `failed` report, `fail` (a node or  | Failed; the guest stays       |
|                 | the VMI lost), a cancel before the    |                               |
|                 | source transfers                      |                               |
| Failed          | the source reports `converged` (its   | Succeeded, and the VMI's      |
|                 | libvirt handed the guest over), the   | nodeName = target: the guest  |
|                 | VMI still on the source               | runs there                    |

A cancel once the source transfers asks it to stop (`MigrationAbortRequested`); its `failed`
report ends the migration (abortStatus Succeeded), or its `converged` one came first
(Succeeded; abortStatus Failed).
"""

from __future__ import annotations

import uuid
from typing import Final

import msgspec

from controlplane.aggregate import Aggregate
from controlplane.clusterconfig import ClusterConfig
from controlplane.decision import Decision, Rejected, handles
from controlplane.vmi.commands import agent_version
from events.api.base import ObjectMeta
from events.api.migration import KIND, VirtualMachineInstanceMigration
from events.language.ids import random_uuid
from events.language.kinds.migration import (
    MIGRATION_KIND,
    MigrationAbortRequested,
    MigrationCreated,
    MigrationDeleted,
    MigrationPhaseChanged,
    MigrationProgressed,
    MigrationTargetScheduled,
    MigrationTargetUnschedulable,
    Priority,
    VirtualMachineInstanceMigrated,
    VirtualMachineInstanceMigrationFailed,
    VirtualMachineInstanceMigrationStarted,
)
from events.language.kinds.vm import VM_KIND, VMI_KIND
from events.language.messages import MigrationObservation, MigrationOrder, node_actor
from events.language.subjects import aggregate_id
from projections.kinds.migration import MigrationView
from projections.kinds.vm import VirtualMachineInstanceView, VirtualMachineView
from projections.migratable import migration_data_bytes, not_migratable

VIRTCTL_NAME_PREFIX: Final = "kubevirt-migrate-vm-"
"""virtctl's generateName for the migration `migrate` creates."""
EVACUATION_NAME_PREFIX: Final = "kubevirt-evacuation-"
"""KubeVirt's evacuation controller's generateName."""
WORKLOAD_UPDATE_NAME_PREFIX: Final = "kubevirt-workload-update-"
"""KubeVirt's workload updater's generateName."""
_NAMES = uuid.UUID("3f0b8f39-6a55-5c41-9e0a-1d7c2b4e8a90")


class TargetBody(msgspec.Struct, frozen=True, kw_only=True):
    node: str


class MessageBody(msgspec.Struct, frozen=True, kw_only=True):
    message: str


class FailBody(msgspec.Struct, frozen=True, kw_only=True):
    reason: str


class EvacuationBody(msgspec.Struct, frozen=True, kw_only=True):
    """A controller's (evacuation, workload updater): which VMI leaves which node."""

    vmi_name: str
    node: str


def generated_name(prefix: str, command_id: str) -> str:
    """`generateName`'s five random characters, derived from the command id instead, so
    the same command makes the same migration however often it is decided."""
    return prefix + uuid.uuid5(_NAMES, command_id).hex[:5]


def load_migration(d: Decision, namespace: str, name: str) -> Aggregate[MigrationView]:
    return d.load(aggregate_id(MIGRATION_KIND, namespace, name), MigrationView)


def existing_migration(d: Decision) -> Aggregate[MigrationView]:
    return d.existing(MIGRATION_KIND, MigrationView, "virtualmachineinstancemigration")


def load_vmi(d: Decision, namespace: str, name: str) -> Aggregate[VirtualMachineInstanceView]:
    return d.load(aggregate_id(VMI_KIND, namespace, name), VirtualMachineInstanceView)


def migratable_vmi(d: Decision, namespace: str,
                   name: str) -> Aggregate[VirtualMachineInstanceView]:
    """The VMI a new migration may move, or KubeVirt's refusal (create admitter)."""
    vmi = load_vmi(d, namespace, name)
    state = vmi.state
    if not vmi.exists:
        raise Rejected(f'the VMI "{namespace}/{name}" does not exist', "spec.vmiName")
    if not state.active:
        raise Rejected("Cannot migrated VMI in finalized state.", "spec.vmiName")
    if state.phase != "Running" or not state.node or state.deletion_requested_at is not None:
        raise Rejected(f"Cannot migrate VMI {namespace}/{name}: it is {state.phase}, not "
                       "Running", "spec.vmiName")
    if state.spec is not None:
        refused = not_migratable(state.spec, state.metadata.annotations)
        if refused is not None:
            raise Rejected(f"Cannot migrate VMI, Reason: {refused.reason}, "
                           f"Message: {refused.message}", "spec.vmiName")
    if state.migration is not None and state.migration.in_flight:
        raise Rejected(f"in-flight migration detected. Active migration job "
                       f"({state.migration.migration_uid}) is currently already in progress "
                       f"for VMI {name}.", "spec.vmiName")
    for other in d.all_existing(MIGRATION_KIND, MigrationView):
        o = other.state
        if o.metadata.namespace == namespace and o.vmi_name == name and not o.finished:
            raise Rejected(f"in-flight migration detected. Active migration job ({o.uid}) is "
                           f"currently already in progress for VMI {name}.", "spec.vmiName")
    return vmi


def create(d: Decision, namespace: str, name: str, vmi_name: str, *, priority: Priority,
           labels: dict[str, str] | None = None) -> None:
    migration = load_migration(d, namespace, name)
    if migration.exists:
        raise Rejected(f'virtualmachineinstancemigrations "{name}" already exists',
                       "metadata.name")
    vmi = migratable_vmi(d, namespace, vmi_name)
    meta = ObjectMeta(name=name, namespace=namespace, labels=labels or {})
    d.trigger(migration, MigrationCreated, uid=random_uuid(), metadata=meta,
              vmi_name=vmi_name, vmi_uid=vmi.state.uid, source_node=vmi.state.node,
              priority=priority)


@handles(KIND, "apply")
def apply(d: Decision) -> None:
    new = d.submitted(VirtualMachineInstanceMigration)
    meta = new.metadata
    existing = load_migration(d, meta.namespace, meta.name)
    if existing.exists:
        if existing.state.vmi_name != new.spec.vmi_name:
            raise Rejected("spec: a migration's spec cannot change", "spec.vmiName")
        return  # the same migration applied again
    if not new.spec.vmi_name:
        raise Rejected("spec.vmiName is required", "spec.vmiName")
    create(d, meta.namespace, meta.name, new.spec.vmi_name, priority="user", labels=meta.labels)


def migrate(d: Decision) -> None:
    """`virtctl migrate VM`: a migration of the VM's (or the VMI's) instance."""
    cmd = d.command
    if d.command.kind == "VirtualMachine":
        vm = d.load(aggregate_id(VM_KIND, cmd.namespace, cmd.name), VirtualMachineView)
        if not vm.exists:
            raise Rejected(f'virtualmachine "{cmd.namespace}/{cmd.name}" not found',
                           "metadata.name")
        if not load_vmi(d, cmd.namespace, cmd.name).state.active:
            raise Rejected(f"VM {cmd.name} is not running", "metadata.name")
    create(d, cmd.namespace, generated_name(VIRTCTL_NAME_PREFIX, cmd.id), cmd.name,
           priority="user")


def migrate_cancel(d: Decision) -> None:
    """`virtctl migrate-cancel VM`: abort the VMI's migration in flight."""
    cmd = d.command
    for found in d.all_existing(MIGRATION_KIND, MigrationView):
        m = found.state
        if m.metadata.namespace == cmd.namespace and m.vmi_name == cmd.name and not m.finished:
            abort(d, found)
            return
    raise Rejected(f"Found no migration to cancel for {cmd.name}", "metadata.name")


for _kind in ("VirtualMachine", "VirtualMachineInstance"):
    handles(_kind, "migrate")(migrate)
    handles(_kind, "migrate-cancel")(migrate_cancel)


def abort(d: Decision, migration: Aggregate[MigrationView]) -> None:
    """Before the source transfers, the migration just fails; after, the source is asked to
    stop and its report decides."""
    m = migration.state
    if m.abort_requested:
        return
    d.trigger(migration, MigrationAbortRequested)
    if m.phase not in ("TargetReady", "Running"):
        fail_migration(d, migration, "Migration aborted", aborted=True)


@handles(KIND, "delete")
def delete(d: Decision) -> None:
    """A finished migration goes; one in flight is aborted first (delete it again once it
    has failed), so deleting never leaves a guest half moved."""
    migration = existing_migration(d)
    if migration.state.finished:
        d.trigger(migration, MigrationDeleted)
    else:
        abort(d, migration)


@handles(KIND, "create-for-evacuation", internal=True)
def create_for_evacuation(d: Decision) -> None:
    body = d.body(EvacuationBody)
    create_for(d, body, "evacuation", EVACUATION_NAME_PREFIX,
               {"kubevirt.io/evacuation": body.node})


@handles(KIND, "create-for-workload-update", internal=True)
def create_for_workload_update(d: Decision) -> None:
    create_for(d, d.body(EvacuationBody), "workload-update", WORKLOAD_UPDATE_NAME_PREFIX,
               {"kubevirt.io/workloadUpdateMigration": ""})


def create_for(d: Decision, body: EvacuationBody, priority: Priority, prefix: str,
               labels: dict[str, str]) -> None:
    """A controller's migration of a VMI off `body.node`, if it is still there."""
    vmi = load_vmi(d, d.command.namespace, body.vmi_name)
    if vmi.state.node != body.node:
        raise Rejected(f"the VMI is no longer on {body.node}")
    create(d, d.command.namespace, generated_name(prefix, d.command.id), body.vmi_name,
           priority=priority, labels=labels)


@handles(KIND, "admit", internal=True)
def admit(d: Decision) -> None:
    """A Pending migration takes a slot: never more running than the configuration allows,
    in the cluster or out of its source node, however many are admitted at once (the
    decision reads every migration, and the batch is refused if any changed meanwhile)."""
    migration = existing_migration(d)
    m = migration.state
    if m.phase != "Pending":
        raise Rejected("no longer pending")
    config = ClusterConfig.of_decision(d).migrations
    running = [o.state for o in d.all_existing(MIGRATION_KIND, MigrationView) if o.state.running]
    if len(running) >= config.parallel_per_cluster:
        raise Rejected(f"{len(running)} migrations running: parallelMigrationsPerCluster is "
                       f"{config.parallel_per_cluster}")
    outbound = sum(1 for o in running if o.source_node == m.source_node)
    if outbound >= config.parallel_outbound_per_node:
        raise Rejected(f"{outbound} migrations out of {m.source_node}: "
                       f"parallelOutboundMigrationsPerNode is {config.parallel_outbound_per_node}")
    d.trigger(migration, MigrationPhaseChanged, phase="Scheduling")


@handles(KIND, "schedule-target", internal=True)
def schedule_target(d: Decision) -> None:
    migration = existing_migration(d)
    m = migration.state
    target = d.body(TargetBody).node
    if m.phase != "Scheduling":
        raise Rejected("not scheduling")
    if target == m.source_node:
        raise Rejected("the target must not be the source node", "node")
    vmi = load_vmi(d, m.metadata.namespace, m.vmi_name)
    if vmi.state.uid != m.vmi_uid or vmi.state.node != m.source_node or vmi.state.spec is None:
        fail_migration(d, migration, "the VMI is no longer on the source node")
        return
    config = ClusterConfig.of_decision(d).migrations
    order = MigrationOrder(
        uid=m.uid, name=m.metadata.name, source_node=m.source_node, target_node=target,
        bandwidth_bytes_per_second=config.bandwidth_bytes_per_second,
        progress_timeout_seconds=config.progress_timeout,
        completion_timeout_seconds=config.completion_timeout_seconds(
            migration_data_bytes(vmi.state.spec)),
        allow_post_copy=config.allow_post_copy, allow_auto_converge=config.allow_auto_converge)
    d.trigger(migration, MigrationTargetScheduled, order=order)
    d.trigger(migration, MigrationPhaseChanged, phase="PreparingTarget")
    d.trigger(vmi, VirtualMachineInstanceMigrationStarted, migration_uid=m.uid,
              migration_name=m.metadata.name, source_node=m.source_node, target_node=target)


@handles(KIND, "target-unschedulable", internal=True)
def target_unschedulable(d: Decision) -> None:
    migration = existing_migration(d)
    message = d.body(MessageBody).message
    if migration.state.phase != "Scheduling":
        raise Rejected("not scheduling")
    if message != migration.state.unschedulable_message:
        d.trigger(migration, MigrationTargetUnschedulable, message=message)


@handles(KIND, "fail", internal=True)
def fail(d: Decision) -> None:
    """A controller's verdict: a node under the migration is lost, or its VMI is gone."""
    migration = existing_migration(d)
    if migration.state.finished:
        raise Rejected("already finished")
    fail_migration(d, migration, d.body(FailBody).reason)


def fail_migration(d: Decision, migration: Aggregate[MigrationView], reason: str, *,
                   aborted: bool = False) -> None:
    m = migration.state
    d.trigger(migration, MigrationPhaseChanged, phase="Failed", reason=reason)
    vmi = load_vmi(d, m.metadata.namespace, m.vmi_name)
    started = vmi.state.migration
    if vmi.exists and started is not None and started.migration_uid == m.uid \
            and started.in_flight:
        d.trigger(vmi, VirtualMachineInstanceMigrationFailed, reason=reason, aborted=aborted)


@handles(KIND, "observe", internal=True)
def observe(d: Decision) -> None:
    """An agent's report of a migration, turned into phase changes. Reports come in any
    order; each moves the migration only forward, and only from the node it concerns."""
    obs = d.body(MigrationObservation)
    vmi = load_vmi(d, d.command.namespace, d.command.name)  # reports name the VMI
    started = vmi.state.migration
    if not vmi.exists or started is None or started.migration_uid != obs.migration_uid:
        raise Rejected("stale report: not the VMI's migration")
    migration = load_migration(d, d.command.namespace, started.migration_name)
    m = migration.state
    if m.uid != obs.migration_uid or m.vmi_uid != obs.vmi_uid or m.order is None:
        raise Rejected("stale report: no such migration")
    reporter = m.target_node if obs.state == "target-ready" else m.source_node
    if obs.state == "failed" and d.command.actor == node_actor(m.target_node):
        reporter = m.target_node  # the target may fail its preparation
    if d.command.actor != node_actor(reporter):
        raise Rejected(f"{d.command.actor} reported a migration from {m.source_node!r} to "
                       f"{m.target_node!r}", "node")
    if m.finished:
        if obs.state == "converged" and m.phase == "Failed":
            handed_over_after_failure(d, migration, obs)
            return
        raise Rejected("already finished")
    match obs.state:
        case "target-ready":
            if m.phase == "PreparingTarget":
                d.trigger(migration, MigrationPhaseChanged, phase="TargetReady",
                          target_address=obs.target_address)
        case "running" | "progress":
            if m.phase == "TargetReady":
                d.trigger(migration, MigrationPhaseChanged, phase="Running")
            if obs.state == "progress" and m.phase in ("TargetReady", "Running"):
                d.trigger(migration, MigrationProgressed, mode=obs.mode,
                          data_total=obs.data_total, data_processed=obs.data_processed,
                          data_remaining=obs.data_remaining)
        case "converged":
            if m.phase not in ("TargetReady", "Running"):
                raise Rejected(f"converged while {m.phase}")
            succeed(d, migration, obs)
        case "failed":
            fail_migration(d, migration, obs.reason or "migration failed",
                           aborted=m.abort_requested)


def handed_over_after_failure(d: Decision, migration: Aggregate[MigrationView],
                              obs: MigrationObservation) -> None:
    """The source's libvirt handed the guest over although the migration was failed
    meanwhile (a lost node, a cancel after the hand-over): the guest runs on the target, so
    the migration Succeeded and the VMI is there, as KubeVirt goes by where the domain runs.
    Only while the VMI is still this migration's instance on the source."""
    m = migration.state
    vmi = load_vmi(d, m.metadata.namespace, m.vmi_name)
    if vmi.state.uid != m.vmi_uid or vmi.state.node != m.source_node or not vmi.state.active:
        raise Rejected("already finished, and the VMI is no longer on the source node")
    succeed(d, migration, obs)


def succeed(d: Decision, migration: Aggregate[MigrationView], obs: MigrationObservation) -> None:
    """The guest moves: the migration's Succeeded and the VMI's new node, in one batch."""
    m = migration.state
    vmi = load_vmi(d, m.metadata.namespace, m.vmi_name)
    if vmi.state.uid != m.vmi_uid or vmi.state.node != m.source_node or not vmi.state.active:
        fail_migration(d, migration, "the VMI is no longer on the source node")
        return
    if m.phase == "TargetReady":
        d.trigger(migration, MigrationPhaseChanged, phase="Running")
    d.trigger(migration, MigrationProgressed, mode=obs.mode, data_total=obs.data_total,
              data_processed=obs.data_total, data_remaining=0)
    d.trigger(migration, MigrationPhaseChanged, phase="Succeeded")
    d.trigger(vmi, VirtualMachineInstanceMigrated, node=m.target_node, mode=obs.mode,
              aborting_failed=m.abort_requested,
              launcher_version=agent_version(d, m.target_node))
