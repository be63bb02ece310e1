"""Commands of VirtualMachineInstancePresets (apply, delete), and `fill`: what the matching
presets make of a VMI being created, as KubeVirt's preset mutator (`applyPresets`) did.

| presets matching the VMI's labels (its namespace)  | the VMI's creation                      |
|----------------------------------------------------|-----------------------------------------|
| the VMI is annotated `virtualmachineinstance       | as submitted, no preset looked at       |
| presets.admission.kubevirt.io/exclude: "true"`     |                                         |
| two of them set one field differently              | refused, naming both presets and field  |
| a preset sets a field the VMI leaves unset         | filled from the preset                  |
| a preset sets a field the VMI sets differently     | the VMI's value stays; conflict event   |
| a preset with a field now equal to the VMI's       | applied: annotated `virtualmachinepreset|
|                                                    | .kubevirt.io/<name>: kubevirt.io/v1`    |

Fields compared, as KubeVirt's `checkMergeConflicts`: `resources.requests` (per resource),
`cpu`, `firmware`, `clock` (its offset, and its timer), `features`, `devices.watchdog`,
`ioThreadsPolicy`; presets are taken in name order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec
import structlog

from controlplane.decision import Decision, Rejected, apply_namespaced, handles
from events.api.base import ObjectMeta
from events.api.domain import Clock, DomainSpec
from events.api.replicaset import PRESET, VirtualMachineInstancePreset
from events.api.scheduling import selector_matches
from events.api.vm import API_VERSION, VirtualMachineInstanceSpec
from events.language.kinds.preset import (
    PRESET_KIND,
    VirtualMachineInstancePresetApplied,
    VirtualMachineInstancePresetDeleted,
)
from projections.kinds.replicaset import PresetView

log = structlog.get_logger(__name__)

EXCLUDE_ANNOTATION: Final = "virtualmachineinstancepresets.admission.kubevirt.io/exclude"
APPLIED_ANNOTATION_PREFIX: Final = "virtualmachinepreset.kubevirt.io/"
"""KubeVirt's `annotateVMI`: `virtualmachinepreset.<group>/<preset name>`."""


@handles(PRESET, "apply")
def apply(d: Decision) -> None:
    apply_namespaced(d, VirtualMachineInstancePreset, PRESET_KIND, PresetView,
                     VirtualMachineInstancePresetApplied)


@handles(PRESET, "delete")
def delete(d: Decision) -> None:
    d.trigger(d.existing(PRESET_KIND, PresetView, PRESET.lower()),
              VirtualMachineInstancePresetDeleted)


class Conflict(msgspec.Struct, frozen=True):
    """A preset that matched a VMI and set some field differently from it."""

    preset: str
    applied: bool
    message: str


class Filled(msgspec.Struct, frozen=True):
    annotations: dict[str, str]
    spec: VirtualMachineInstanceSpec
    conflicts: list[Conflict]


def _shown(value: object) -> str:
    return msgspec.json.encode(value).decode()


def _differ(path: str, preset: object, vmi: object) -> list[str]:
    """KubeVirt's per-field check: both set and not equal."""
    if preset is None or vmi is None or preset == vmi:
        return []
    return [f"{path}: {_shown(preset)} != {_shown(vmi)}"]


def conflicts(preset: DomainSpec, vmi: DomainSpec) -> list[str]:
    """KubeVirt's `checkMergeConflicts`, in its order and with its field paths."""
    out = [f"spec.resources.requests[{key}]: {_shown(value)} != "
           f"{_shown(vmi.resources.requests[key])}"
           for key, value in preset.resources.requests.items()
           if key in vmi.resources.requests and vmi.resources.requests[key] != value]
    out += _differ("spec.cpu", preset.cpu, vmi.cpu)
    out += _differ("spec.firmware", preset.firmware, vmi.firmware)
    if preset.clock is not None and vmi.clock is not None:
        out += _differ("spec.clock.clockoffset", _offset(preset.clock), _offset(vmi.clock))
        out += _differ("spec.clock.timer", preset.clock.timer, vmi.clock.timer)
    out += _differ("spec.features", preset.features, vmi.features)
    out += _differ("spec.devices.watchdog", preset.devices.watchdog, vmi.devices.watchdog)
    out += _differ("spec.ioThreadsPolicy", preset.io_threads_policy, vmi.io_threads_policy)
    return out


def _offset(clock: Clock) -> Clock:
    """The clock's offset (`utc` or `timezone`), without its timer."""
    return msgspec.structs.replace(clock, timer=None)


Field = tuple[Callable[[DomainSpec], Any], Callable[[DomainSpec, Any], DomainSpec]]
_WHOLE_FIELDS: Final[tuple[Field, ...]] = (
    (lambda s: s.cpu, lambda s, v: msgspec.structs.replace(s, cpu=v)),
    (lambda s: s.firmware, lambda s, v: msgspec.structs.replace(s, firmware=v)),
    (lambda s: s.features, lambda s, v: msgspec.structs.replace(s, features=v)),
    (lambda s: s.devices.watchdog,
     lambda s, v: msgspec.structs.replace(s, devices=msgspec.structs.replace(s.devices,
                                                                            watchdog=v))),
    (lambda s: s.io_threads_policy, lambda s, v: msgspec.structs.replace(s,
                                                                        io_threads_policy=v)),
)
"""Fields a preset gives whole, where the VMI has none (KubeVirt's DeepCopyInto)."""


def merge(preset: DomainSpec, vmi: DomainSpec) -> tuple[DomainSpec, bool]:
    """KubeVirt's `mergeDomainSpec`: the VMI's domain with what it leaves unset taken from
    the preset, and whether any field of the preset now holds on the VMI (`applied`)."""
    applied = False
    if preset.resources.requests:
        if not vmi.resources.requests:
            vmi = msgspec.structs.replace(vmi, resources=msgspec.structs.replace(
                vmi.resources, requests=dict(preset.resources.requests)))
        applied |= vmi.resources.requests == preset.resources.requests
    for get, put in _WHOLE_FIELDS:
        wanted = get(preset)
        if wanted is None:
            continue
        if get(vmi) is None:
            vmi = put(vmi, wanted)
        applied |= get(vmi) == wanted
    if preset.clock is not None:
        clock = vmi.clock if vmi.clock is not None else _offset(preset.clock)
        applied |= clock == preset.clock
        if preset.clock.timer is not None:
            if clock.timer is None:
                clock = msgspec.structs.replace(clock, timer=preset.clock.timer)
            applied |= clock.timer == preset.clock.timer
        vmi = msgspec.structs.replace(vmi, clock=clock)
    return vmi, applied


def presets_in(d: Decision, namespace: str) -> list[PresetView]:
    """The presets of `namespace`, in name order. Reading them guards the decision: a preset
    of the namespace applied meanwhile makes it decide again."""
    return sorted((p.state for p in d.all_existing(PRESET_KIND, PresetView, namespace)),
                  key=lambda p: p.metadata.name)


def fill(presets: list[PresetView], meta: ObjectMeta,
         spec: VirtualMachineInstanceSpec) -> Filled:
    """What those of `presets` that select the VMI's labels make of it (see the table
    above)."""
    annotations = dict(meta.annotations)
    if annotations.get(EXCLUDE_ANNOTATION) == "true":
        return Filled(annotations, spec, [])
    matching = [p for p in presets if selector_matches(p.spec.selector, meta.labels)]
    _refuse_conflicting(matching)
    domain, found = spec.domain, []
    for preset in matching:
        if preset.spec.domain is None:
            continue
        problems = conflicts(preset.spec.domain, domain)
        domain, applied = merge(preset.spec.domain, domain)
        name = preset.metadata.name
        if applied:
            annotations[APPLIED_ANNOTATION_PREFIX + name] = API_VERSION
        if problems:
            found.append(Conflict(name, applied, "; ".join(problems)))
            log.warning("preset conflicts with the VMI", preset=name, applied=applied,
                        namespace=meta.namespace, vmi=meta.name, conflicts=problems)
    return Filled(annotations, msgspec.structs.replace(spec, domain=domain), found)


def _refuse_conflicting(presets: list[PresetView]) -> None:
    """KubeVirt's `checkPresetConflicts`: presets that disagree make the VMI unacceptable."""
    problems = [f"presets '{b.metadata.name}' and '{a.metadata.name}' conflict: "
                f"{'; '.join(found)}"
                for i, a in enumerate(presets) for b in presets[i + 1:]
                if a.spec.domain is not None and b.spec.domain is not None
                and (found := conflicts(b.spec.domain, a.spec.domain))]
    if problems:
        raise Rejected("VirtualMachinePresets cannot be applied due to conflicts: "
                       + "; ".join(problems), "metadata.labels")
