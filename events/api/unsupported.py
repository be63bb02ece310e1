"""What KubeVirt admits that virtbus nodes do not provide, stated once for the agent (which
fails a launch that needs it) and the read models (which say what a running guest lacks).

Unmet needs: the guest would be a different machine, so its launch fails with the reasons
(the VMI's Failed `status.reason`); GPUs and host devices first keep it Pending (their
`deviceName` is a scheduler resource no virtbus node advertises).

| spec field                                 | why                                        |
|--------------------------------------------|--------------------------------------------|
| `domain.devices.interfaces[i].sriov`       | nodes plug tap devices only, no SR-IOV VF  |
| `domain.devices.gpus[i]`                   | no device plugin hands out GPUs            |
| `domain.devices.hostDevices[i]`            | no device plugin hands out host devices    |
| `domain.cpu.numa.guestMappingPassthrough`  | host NUMA cells are not mapped to guests   |
| `volumes[i].hostDisk` (its gate on)        | an agent attaches files of its VMI's own   |
|                                            | directory only, never a host path          |

Inert fields: the guest runs, without what they ask; the VMI says so in its `SpecHonoured`
condition (False, `NotOnVirtbusNodes`, the fields and why in its message).

| spec field                                 | why                                        |
|--------------------------------------------|--------------------------------------------|
| `dnsPolicy`, `dnsConfig`                   | no pod: no pod resolver to configure       |
| `domain.devices.interfaces[i].ports`       | taps are not NATed: no ports to forward    |
| `domain.devices.tpm.persistent`            | TPM state is dropped with the domain at stop |

A preference's device fields a virtbus VMI has no place for are not applied: the VMI's
expansion names them in its `virtbus.io/unapplied-preferences` annotation, and its
`SpecHonoured` condition states them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from events.api.validation import VMISpecLike

NOT_HONOURED_CONDITION: Final = "SpecHonoured"
NOT_HONOURED_REASON: Final = "NotOnVirtbusNodes"
UNAPPLIED_PREFERENCES_ANNOTATION: Final = "virtbus.io/unapplied-preferences"
"""On a VMI expanded from a preference: the preference's fields (JSON paths in it, comma
separated) a virtbus VMI could not take."""


def unmet_needs(spec: VMISpecLike) -> Iterator[str]:
    """`field: why` for each part of `spec` without which the guest cannot be launched."""
    devices = spec.domain.devices
    for index, interface in enumerate(devices.interfaces):
        if interface.sriov is not None:
            yield (f"spec.domain.devices.interfaces[{index}].sriov: this node has no SR-IOV "
                   f"virtual function for interface {interface.name!r}")
    for index, gpu in enumerate(devices.gpus):
        yield (f"spec.domain.devices.gpus[{index}]: this node has no "
               f"{gpu.device_name or gpu.claim_name!r} device to pass through as GPU "
               f"{gpu.name!r}")
    for index, device in enumerate(devices.host_devices):
        yield (f"spec.domain.devices.hostDevices[{index}]: this node has no "
               f"{device.device_name or device.claim_name!r} device to pass through as "
               f"{device.name!r}")
    for index, volume in enumerate(spec.volumes):
        if volume.host_disk is not None:
            yield (f"spec.volumes[{index}].hostDisk: a virtbus node attaches only files of "
                   f"the VMI's own disk directory, not host path {volume.host_disk.path!r}")
    cpu = spec.domain.cpu
    if cpu is not None and cpu.numa is not None and cpu.numa.guest_mapping_passthrough is not None:
        yield ("spec.domain.cpu.numa.guestMappingPassthrough: this node does not map host "
               "NUMA cells to guests")


def inert_fields(spec: VMISpecLike, annotations: Mapping[str, str]) -> Iterator[str]:
    """`field: why` for each part of `spec` (and of the preference it was expanded with, per
    its `annotations`) a running guest goes without."""
    if spec.dns_policy or spec.dns_config is not None:
        yield "spec.dnsPolicy/dnsConfig: a virtbus guest has no pod resolver to configure"
    for index, interface in enumerate(spec.domain.devices.interfaces):
        if interface.ports:
            yield (f"spec.domain.devices.interfaces[{index}].ports: interface "
                   f"{interface.name!r} is a tap without NAT, so no port is forwarded")
    tpm = spec.domain.devices.tpm
    if tpm is not None and tpm.enabled is not False and tpm.persistent:
        yield ("spec.domain.devices.tpm.persistent: the TPM state lives with the domain, "
               "which a stop removes")
    if unapplied := annotations.get(UNAPPLIED_PREFERENCES_ANNOTATION):
        yield (f"preference {unapplied.replace(',', ', ')}: a virtbus VMI has no field to "
               "take them, so they were not applied")
