"""What KubeVirt's VM mutating webhook writes into the VM itself from its preference
(`mutateArch`, `mutateMachineType`, `mutateDataVolumeTemplates`): the stored VM, not only its
VMIs, carries the preferred architecture, machine type and storage class where it names none.
"""

from __future__ import annotations

from typing import Any

import msgspec

from events.api.domain import Machine
from events.api.instancetype import VirtualMachinePreferenceSpec
from events.api.vm import VirtualMachine


def with_preferred_defaults(vm: VirtualMachine,
                            preference: VirtualMachinePreferenceSpec) -> VirtualMachine:
    template = vm.spec.template.spec
    domain = template.domain
    if preference.preferred_architecture and not template.architecture:
        template = msgspec.structs.replace(template,
                                           architecture=preference.preferred_architecture)
    machine_type = preference.machine.preferred_machine_type if preference.machine else ""
    if machine_type and (domain.machine is None or not domain.machine.type):
        domain = msgspec.structs.replace(domain, machine=Machine(type=machine_type))
    template = msgspec.structs.replace(template, domain=domain)
    storage_class = preference.volumes.preferred_storage_class_name \
        if preference.volumes else ""
    data_volumes = [_with_storage_class(t, storage_class) for t in vm.spec.data_volume_templates]
    spec = msgspec.structs.replace(
        vm.spec, data_volume_templates=data_volumes,
        template=msgspec.structs.replace(vm.spec.template, spec=template))
    return msgspec.structs.replace(vm, spec=spec)


def _with_storage_class(template: dict[str, Any], storage_class: str) -> dict[str, Any]:
    """A DataVolume template with the class in its `pvc` and `storage` where they name none."""
    spec = template.get("spec")
    if not storage_class or not isinstance(spec, dict):
        return template
    spec = dict(spec)
    for claim in ("pvc", "storage"):
        if isinstance(spec.get(claim), dict) and "storageClassName" not in spec[claim]:
            spec[claim] = {**spec[claim], "storageClassName": storage_class}
    return {**template, "spec": spec}
