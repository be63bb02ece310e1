"""KubeVirt's `LiveMigratable` condition: whether a VMI can move while it runs, and if not,
the reason and message KubeVirt gives (a migration of it is refused with them).

| the VMI has                                          | reason                      |
|------------------------------------------------------|-----------------------------|
| a `persistentVolumeClaim` / `dataVolume` volume (on  | DisksNotLiveMigratable      |
| a virtbus node a local file: never ReadWriteMany)    |                             |
| a `bridge` interface on the pod network, without the | InterfaceNotLiveMigratable  |
| `kubevirt.io/allow-pod-bridge-network-live-migration`|                             |
| annotation                                           |                             |
| a `hostDisk` not `shared`                            | DisksNotLiveMigratable      |
| a GPU or a host device passed through                | HostDeviceNotLiveMigratable |

Everything else migrates; `containerDisk` and `emptyDisk` volumes are copied with the
memory (block migration), so they count toward the completion timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from events.api.resources import guest_memory_bytes, quantity
from events.api.vm import VirtualMachineInstanceSpec

DISKS_NOT_LIVE_MIGRATABLE: Final = "DisksNotLiveMigratable"
INTERFACE_NOT_LIVE_MIGRATABLE: Final = "InterfaceNotLiveMigratable"
HOST_DEVICE_NOT_LIVE_MIGRATABLE: Final = "HostDeviceNotLiveMigratable"
ALLOW_POD_BRIDGE_ANNOTATION: Final = "kubevirt.io/allow-pod-bridge-network-live-migration"
_BRIDGE_MESSAGE: Final = ("cannot migrate VMI which does not use masquerade, bridge with "
                          f"{ALLOW_POD_BRIDGE_ANNOTATION} VM annotation or a migratable plugin "
                          "to connect to the pod network")


@dataclass(frozen=True, slots=True)
class NotMigratable:
    reason: str
    message: str


def not_migratable(spec: VirtualMachineInstanceSpec,
                   annotations: dict[str, str]) -> NotMigratable | None:
    """Why the VMI cannot live-migrate (KubeVirt's reason and message), or None."""
    for volume in spec.volumes:
        if volume.host_disk is not None and not volume.host_disk.shared:
            return NotMigratable(DISKS_NOT_LIVE_MIGRATABLE,
                                 "cannot migrate VMI with non-shared HostDisk")
        claim = (volume.persistent_volume_claim.claim_name if volume.persistent_volume_claim
                 else volume.data_volume.name if volume.data_volume else "")
        if claim:
            return NotMigratable(DISKS_NOT_LIVE_MIGRATABLE, (
                f"cannot migrate VMI: PVC {claim} is not shared, live migration requires that "
                "all PVCs must be shared (using ReadWriteMany access mode)"))
    devices = spec.domain.devices
    if devices.gpus or devices.host_devices:
        return NotMigratable(HOST_DEVICE_NOT_LIVE_MIGRATABLE, "VMI uses a PCI host devices")
    pod_networks = {n.get("name") for n in spec.networks if isinstance(n, dict) and "pod" in n}
    if ALLOW_POD_BRIDGE_ANNOTATION not in annotations:
        for iface in spec.domain.devices.interfaces:
            if iface.bridge is not None and iface.name in pod_networks:
                return NotMigratable(INTERFACE_NOT_LIVE_MIGRATABLE, _BRIDGE_MESSAGE)
    return None


def migration_data_bytes(spec: VirtualMachineInstanceSpec) -> int:
    """What a migration copies: guest memory, plus the disks copied with it (emptyDisks at
    their capacity)."""
    disks = 0
    for volume in spec.volumes:
        if volume.empty_disk is not None:
            try:
                disks += int(quantity(volume.empty_disk.capacity))
            except (ValueError, ArithmeticError):
                continue  # admission checked it; a log that says otherwise adds nothing
    return guest_memory_bytes(spec.domain) + disks
