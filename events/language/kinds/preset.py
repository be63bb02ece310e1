"""Events of VirtualMachineInstancePresets, and of a preset that could not fill a VMI.

| aggregate                  | events                                                   |
|----------------------------|----------------------------------------------------------|
| `vmipreset.<ns>.<name>`    | VirtualMachineInstancePresetApplied / Deleted            |
| `vmi.<ns>.<name>`          | VirtualMachineInstancePresetConflicted, appended with    |
|                            | the VMI's creation                                       |

A preset changes nothing that exists: it fills VMIs as they are created (KubeVirt's mutating
webhook on CREATE), so editing or deleting one leaves every VMI as it was made.
"""

from __future__ import annotations

from typing import Final

from events.api.base import ObjectMeta
from events.api.replicaset import (
    VIRTUAL_MACHINE_INSTANCE_PRESET,
    VirtualMachineInstancePresetSpec,
)
from events.language.codec import Event, event_type

PRESET_KIND: Final = VIRTUAL_MACHINE_INSTANCE_PRESET.token


@event_type("VirtualMachineInstancePresetApplied")
class VirtualMachineInstancePresetApplied(Event, frozen=True, kw_only=True):
    """Created or changed; `uid` stays for the object's life, `generation` counts spec
    changes."""

    uid: str
    metadata: ObjectMeta
    spec: VirtualMachineInstancePresetSpec
    generation: int


@event_type("VirtualMachineInstancePresetDeleted")
class VirtualMachineInstancePresetDeleted(Event, frozen=True, kw_only=True):
    pass


@event_type("VirtualMachineInstancePresetConflicted")
class VirtualMachineInstancePresetConflicted(Event, frozen=True, kw_only=True):
    """Preset `preset` matched the VMI, but the VMI sets some of its fields differently
    (`message`, KubeVirt's merge-conflict wording): those stay the VMI's own, and the preset
    counts as applied only if another of its fields was (KubeVirt's warning event)."""

    preset: str
    applied: bool
    message: str
