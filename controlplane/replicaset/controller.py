"""The replica set controller: keeps each VirtualMachineInstanceReplicaSet's active VMIs (not
final, not being deleted) at `spec.replicas`, as KubeVirt's `execute` / `scale` /
`cleanFinishedVmis` do. Every row that applies acts, at most `REPLICA_SET_BURST_REPLICAS`
VMIs per pass:

| replica set                 | its VMIs                               | commands                |
|-----------------------------|----------------------------------------|-------------------------|
| -                           | an orphan (no controller: neither a    | adopt (then counted)    |
|                             | VM's nor a replica set's), its labels  |                         |
|                             | matched by the selector, not being     |                         |
|                             | deleted                                |                         |
| -                           | one of its own, its labels no longer   | release (no longer      |
|                             | matched by the selector                | counted)                |
| paused                      | any                                    | none but clear-failure  |
|                             |                                        | (status: ReplicaPaused) |
| -                           | fewer active than `spec.replicas`      | create-replica, one per |
|                             |                                        | missing VMI             |
| -                           | more active than `spec.replicas`       | delete-replica: not yet |
|                             |                                        | running first, then     |
|                             |                                        | migrating, then newest  |
| -                           | finished (Succeeded / Failed), not     | delete (VMI): replaced  |
|                             | being deleted                          | by the create above     |
| ReplicaFailure recorded     | none to create                         | clear-failure           |

Claims come first, even while paused, as KubeVirt's `ClaimVirtualMachineInstances` runs
before `scale`: the count that decides creations and deletions is of the VMIs claimed.
A replica lost to a node failure is Failed by the node lifecycle controller: it stops
counting, so one replacement is created and the failed VMI deleted.

Level-triggered on each replica set and each of its VMIs (an orphan's: every replica set of
its namespace, one of which may adopt it or have released it), and on presets and the KubeVirt
configuration (a refused replica may be accepted now). Command ids name the replica set's
version, the newest sequence of any of its VMIs, of its namespace's presets and the KubeVirt
configuration's version (what a creation reads), and the slot: the same state decided twice
gives the same commands, hence (the VMI's name derived from the id) the same VMI; the
handlers count again on the log, so a stale decision never makes more VMIs than asked.
"""

from __future__ import annotations

import uuid
from typing import Final

import msgspec

from controlplane.controllers import derived_command
from controlplane.defaults import REPLICA_SET_BURST_REPLICAS
from events.api.replicaset import REPLICA_SET
from events.api.scheduling import selector_matches
from events.language.codec import Event
from events.language.kinds.hco import OPERAND_TOKENS
from events.language.kinds.preset import PRESET_KIND
from events.language.kinds.replicaset import REPLICA_SET_KIND
from events.language.kinds.vm import VMI_KIND
from events.language.messages import Command
from events.language.subjects import split_aggregate_id
from projections.cluster import STARTING_PHASES, ClusterState
from projections.hco import operand
from projections.kinds.replicaset import ReplicaSetView
from projections.kinds.vm import VirtualMachineInstanceView

NAME = "replicaset"
_KUBEVIRT: Final = OPERAND_TOKENS["KubeVirt"]
MAX_GENERATED_NAME_LENGTH: Final = 58
"""Kubernetes' `maxGeneratedNameLength`: the base of a generated name, before its suffix."""
SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
SUFFIX_LENGTH: Final = 5
"""Kubernetes' `utilrand.String(5)` of `generateName`: no vowels, no look-alike digits."""


def replica_name(rs: ReplicaSetView, command_id: str) -> str:
    """`<base><5 chars>` as `generateName` makes it, the chars a function of the command:
    KubeVirt's base is the template's name, else its generateName, else the replica set's."""
    template = rs.spec.template.metadata if rs.spec is not None else None
    base = (template.name or template.generate_name if template else "") or rs.metadata.name
    number = uuid.UUID(command_id).int
    suffix = ""
    for _ in range(SUFFIX_LENGTH):
        number, digit = divmod(number, len(SUFFIX_ALPHABET))
        suffix += SUFFIX_ALPHABET[digit]
    return base[:MAX_GENERATED_NAME_LENGTH] + suffix


def is_orphan(vmi: VirtualMachineInstanceView) -> bool:
    """A VMI no controller owns, that a replica set may adopt (KubeVirt's `ClaimObject`:
    neither owned nor being deleted)."""
    return vmi.exists and not vmi.owner and not vmi.replica_set \
        and vmi.deletion_requested_at is None


def deletion_rank(vmi: VirtualMachineInstanceView) -> tuple[int, float, str]:
    """Scale-down order: VMIs not running yet, then migrating ones, then the rest (the order
    KubeVirt's `scale` names in its TODO; it takes them as listed); newest first within."""
    created = vmi.created_at.timestamp() if vmi.created_at else 0.0
    tier = 0 if vmi.phase in STARTING_PHASES else 1 if vmi.migrating else 2
    return tier, -created, vmi.metadata.name


class ReplicaSetController:
    name = NAME

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        kind, namespace, name = split_aggregate_id(event.originator_id)
        if kind in (PRESET_KIND, _KUBEVIRT):
            return self.resync(state)
        if kind == REPLICA_SET_KIND:
            return self.reconcile(state, namespace, name)
        view = state.views.get(event.originator_id)
        if kind != VMI_KIND or not isinstance(view, VirtualMachineInstanceView) or view.owner:
            return []
        if view.replica_set:
            return self.reconcile(state, namespace, view.replica_set)
        return [c for rs in list(state.replica_sets()) if rs.metadata.namespace == namespace
                for c in self.reconcile(state, namespace, rs.metadata.name)]

    def resync(self, state: ClusterState) -> list[Command]:
        return [c for rs in list(state.replica_sets())
                for c in self.reconcile(state, rs.metadata.namespace, rs.metadata.name)]

    def reconcile(self, state: ClusterState, namespace: str, name: str) -> list[Command]:
        rs = state.replica_set(namespace, name)
        if rs is None or rs.spec is None:
            return []
        owned = [v for v in state.views.values() if isinstance(v, VirtualMachineInstanceView)
                 and v.replica_set == name and v.metadata.namespace == namespace]
        seen = max((v.last_sequence for v in owned), default=0)
        # A creation also reads the presets and the KubeVirt configuration: a refusal under
        # them is final for that command only.
        presets = state.presets_seen(namespace)
        configuration = operand(state, "KubeVirt")
        kubevirt = configuration.version if configuration is not None else 0

        def command(verb: str, *key: object, target: str = "",
                    manifest: dict[str, object] | None = None) -> Command:
            kind = "VirtualMachineInstance" if target else REPLICA_SET
            return derived_command(NAME, kind, verb, namespace, target or name, rs.version,
                                   seen, presets, kubevirt, *key, manifest=manifest,
                                   correlation_id=rs.correlation_id)

        selector = rs.spec.selector
        released = [v for v in owned if v.exists
                    and not selector_matches(selector, v.metadata.labels)]
        adopted = [v for v in state.vmis() if v.metadata.namespace == namespace
                   and is_orphan(v) and selector_matches(selector, v.metadata.labels)]
        out = [command(verb, vmi.metadata.name, vmi.last_sequence,
                       manifest={"name": vmi.metadata.name})
               for verb, vmis in (("release", released), ("adopt", adopted)) for vmi in vmis]
        if rs.paused:
            return [*out, command("clear-failure")] if rs.failure is not None else out
        active = [v for v in (*state.replicas(namespace, name), *adopted)
                  if v not in released and not v.final and v.deletion_requested_at is None]
        diff = len(active) - rs.spec.wanted
        if diff < 0:
            for slot in range(min(-diff, REPLICA_SET_BURST_REPLICAS)):
                proposed = command("create-replica", slot)
                out.append(msgspec.structs.replace(
                    proposed, manifest={"name": replica_name(rs, proposed.id)}))
        elif diff > 0:
            for vmi in sorted(active, key=deletion_rank)[:min(diff, REPLICA_SET_BURST_REPLICAS)]:
                out.append(command("delete-replica", vmi.metadata.name,
                                   manifest={"name": vmi.metadata.name}))
        for vmi in owned:
            if vmi.exists and vmi.final and vmi.deletion_requested_at is None:
                out.append(command("delete", target=vmi.metadata.name))
        if diff >= 0 and rs.failure is not None:
            out.append(command("clear-failure"))
        return out
