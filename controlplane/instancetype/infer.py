"""`inferFromVolume`: KubeVirt names the instancetype or preference after labels
(`instancetype.kubevirt.io/default-instancetype`, ...) on the PVC, DataVolume or DataSource
behind a volume (`pkg/instancetype/infer`). virtbus keeps no such storage objects, so there
is never a label to read: each case fails as KubeVirt fails when the object is missing, or
when the volume's type cannot carry labels, and `inferFromVolumeFailurePolicy: Ignore` then
drops the matcher where KubeVirt's error is one it lets a VM ignore.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from events.api.errors import InvalidSpec
from events.api.vm import Matcher, VirtualMachine

IGNORE: Final = "Ignore"
FAILURE_POLICIES: Final = (IGNORE, "Reject")


class _Ignorable(Exception):
    """A failure `inferFromVolumeFailurePolicy: Ignore` lets pass (clearing the matcher)."""


def with_inferred_matchers(vm: VirtualMachine) -> VirtualMachine:
    """`vm` with each `inferFromVolume` matcher resolved: here, dropped under `Ignore` when
    KubeVirt would ignore the failure; otherwise refused with KubeVirt's reason."""
    spec = vm.spec
    for field in ("instancetype", "preference"):
        matcher: Matcher | None = getattr(spec, field)
        if matcher is None or not matcher.infer_from_volume:
            continue
        try:
            reason = _failure(vm, matcher.infer_from_volume)
        except _Ignorable as ignorable:
            if matcher.infer_from_volume_failure_policy == IGNORE:
                spec = msgspec.structs.replace(spec, **{field: None})
                continue
            reason = str(ignorable)
        raise InvalidSpec(f"spec.{field}.inferFromVolume", reason)
    return msgspec.structs.replace(vm, spec=spec)


def _failure(vm: VirtualMachine, volume_name: str) -> str:
    """Why nothing can be inferred from the volume (raises `_Ignorable` for the failures
    KubeVirt lets a VM ignore)."""
    volume = next((v for v in vm.spec.template.spec.volumes if v.name == volume_name), None)
    if volume is None:
        return f"unable to find volume {volume_name} to infer defaults"
    if volume.persistent_volume_claim is not None:
        return f'persistentvolumeclaims "{volume.persistent_volume_claim.claim_name}" not found'
    if volume.data_volume is None:
        raise _Ignorable(f"unable to infer defaults from volume {volume_name} as type is not "
                         "supported")
    name = volume.data_volume.name
    template = next((t for t in vm.spec.data_volume_templates
                     if t.get("metadata", {}).get("name") == name), None)
    if template is None:
        return f'datavolumes.cdi.kubevirt.io "{name}" not found'
    return _from_data_volume_spec(template.get("spec", {}))


def _from_data_volume_spec(spec: Any) -> str:
    source_ref = spec.get("sourceRef") if isinstance(spec, dict) else None
    source = spec.get("source") if isinstance(spec, dict) else None
    if isinstance(source, dict) and isinstance(source.get("pvc"), dict):
        return f'persistentvolumeclaims "{source["pvc"].get("name", "")}" not found'
    if isinstance(source_ref, dict):
        if source_ref.get("kind") != "DataSource":
            raise _Ignorable("unable to infer defaults from DataVolumeSourceRef as Kind "
                             f"{source_ref.get('kind')} is not supported")
        return f'datasources.cdi.kubevirt.io "{source_ref.get("name", "")}" not found'
    raise _Ignorable("unable to infer defaults from DataVolumeSpec as DataVolumeSource is not "
                     "supported")
