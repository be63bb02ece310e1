"""Commands of the four instancetype.kubevirt.io kinds: apply and delete.

Nothing here touches a VM: a VM started before an edit or a deletion keeps the revision it
captured (`revisions`), and one not started yet expands with whatever exists when it starts.
"""

from __future__ import annotations

from controlplane.decision import Decision, Rejected, handles
from events.api.instancetype import (
    CLUSTER_KINDS,
    VirtualMachineClusterInstancetype,
    VirtualMachineClusterPreference,
    VirtualMachineInstancetype,
    VirtualMachinePreference,
)
from events.language.codec import Event
from events.language.ids import random_uuid
from events.language.kinds.instancetype import (
    KIND_TOKENS,
    VirtualMachineInstancetypeApplied,
    VirtualMachineInstancetypeDeleted,
    VirtualMachinePreferenceApplied,
    VirtualMachinePreferenceDeleted,
)
from events.language.subjects import aggregate_id
from projections.kinds.instancetype import InstancetypeView

Submitted = (VirtualMachineInstancetype | VirtualMachineClusterInstancetype
             | VirtualMachinePreference | VirtualMachineClusterPreference)
KINDS: dict[str, tuple[type[Submitted], type[Event], type[Event]]] = {
    cls.__name__: (cls, applied, deleted)
    for cls, applied, deleted in (
        (VirtualMachineInstancetype, VirtualMachineInstancetypeApplied,
         VirtualMachineInstancetypeDeleted),
        (VirtualMachineClusterInstancetype, VirtualMachineInstancetypeApplied,
         VirtualMachineInstancetypeDeleted),
        (VirtualMachinePreference, VirtualMachinePreferenceApplied,
         VirtualMachinePreferenceDeleted),
        (VirtualMachineClusterPreference, VirtualMachinePreferenceApplied,
         VirtualMachinePreferenceDeleted),
    )
}
"""Kind -> (its manifest type, its applied event, its deleted event)."""


def apply(d: Decision) -> None:
    cls, applied, _ = KINDS[d.command.kind]
    new = d.submitted(cls)
    meta = new.metadata
    found = d.load(aggregate_id(KIND_TOKENS[new.kind], meta.namespace, meta.name),
                   InstancetypeView)
    old = found.state
    if found.exists and (old.spec, old.api_version, old.metadata.labels,
                         old.metadata.annotations) == (new.spec, new.api_version, meta.labels,
                                                       meta.annotations):
        return
    uid = old.uid if found.exists else random_uuid()
    generation = old.generation + (old.spec != new.spec) if found.exists else 1
    d.trigger(found, applied, kind=new.kind, api_version=new.api_version, uid=uid,
              metadata=meta, spec=new.spec, generation=generation)


def delete(d: Decision) -> None:
    cmd = d.command
    _, _, deleted = KINDS[cmd.kind]
    namespace = "" if cmd.kind in CLUSTER_KINDS else cmd.namespace
    found = d.load(aggregate_id(KIND_TOKENS[cmd.kind], namespace, cmd.name), InstancetypeView)
    if not found.exists:
        where = f"{namespace}/{cmd.name}" if namespace else cmd.name
        raise Rejected(f'{cmd.kind.lower()} "{where}" not found', "metadata.name")
    d.trigger(found, deleted)


for _kind in KINDS:
    handles(_kind, "apply")(apply)
    handles(_kind, "delete")(delete)
