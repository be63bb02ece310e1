"""`<disk>` devices: each `spec.domain.devices.disks[]` entry backed by its volume.

A volume that no disk names gets a plain disk of its name after the others, and a disk or
cdrom without a bus goes on sata, as KubeVirt defaults them (`events.api.vmi_defaults`).

Every volume becomes a file the agent prepares in the VMI's disk directory
(`ConverterContext.disk_file`, which refuses a path that would lie anywhere else);
`volume_source` is the one place that names it:

| volume source           | file                  | format |
|-------------------------|-----------------------|--------|
| containerDisk           | `<volume>.qcow2`      | qcow2 (overlay on the image) |
| emptyDisk               | `<volume>.qcow2`      | qcow2  |
| persistentVolumeClaim   | `<volume>.img`        | raw    |
| dataVolume              | `<volume>.img`        | raw    |
| cloudInitNoCloud        | `<volume>.iso`        | raw (NoCloud ISO) |
| cloudInitConfigDrive    | `<volume>.iso`        | raw (config-drive ISO) |
| secret, configMap, sysprep, serviceAccount | `<volume>.iso` | raw (ISO of the object's files) |
| ephemeral               | `<volume>.qcow2`      | qcow2 (overlay on the claim) |
| downwardMetrics         | `<volume>.img`        | raw (vhostmd metrics disk) |

KubeVirt puts each config ISO in a directory of its kind (`secret-disks/<volume>.iso`, …,
`service-account-disk/service-account.iso`); here one directory per VMI holds them all, so
each is named by its volume, which is unique.

The disk's device type decides the `<disk>` element:

| disk           | element                                   | read-only                |
|----------------|-------------------------------------------|--------------------------|
| disk (or none) | `type='file' device='disk'`, source file  | `disk.readonly`          |
| cdrom          | `type='file' device='cdrom'`, source file | unless `readonly: false` |
| lun            | `type='block' device='lun'`, source dev   | `lun.readonly`           |
| downwardMetrics volume (a disk) | as disk                  | always                   |

A lun's path is the same name, but must be a block device (or a symlink to one): libvirt
takes `device='lun'` only with a block or network source, as virt-launcher emits for block
claims. `lun.reservation` adds `<reservations managed='no'>` on the qemu-pr-helper socket
(`defaults.PR_HELPER_SOCKET`). The downwardMetrics disk's content (vhostmd format) is the
agent's, as it is virt-launcher's and virt-handler's in KubeVirt: `nodeagent.downwardmetrics`
creates it at launch and rewrites it; here it is only named and attached.

Target names follow the bus as in KubeVirt: `vdX` on virtio, `sdX` on sata/scsi/usb.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from events.api.vmi_defaults import DISK_BUS, vmi_disks
from nodeagent.converter import defaults
from nodeagent.converter.xmltree import child, sub

if TYPE_CHECKING:
    from events.api.domain import Disk, Volume
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


class DiskSource(NamedTuple):
    path: str
    format: str


def volume_source(ctx: ConverterContext, volume: Volume) -> DiskSource:
    """The image file backing `volume` on this node, and its format."""
    iso_sources = (volume.cloud_init_no_cloud, volume.cloud_init_config_drive, volume.secret,
                   volume.config_map, volume.sysprep, volume.service_account)
    if any(source is not None for source in iso_sources):
        extension, image_format = ".iso", "raw"
    elif any(source is not None
             for source in (volume.container_disk, volume.empty_disk, volume.ephemeral)):
        extension, image_format = ".qcow2", "qcow2"
    else:
        extension, image_format = ".img", "raw"
    return DiskSource(ctx.disk_file(volume.name + extension), image_format)


def device_name(prefix: str, index: int) -> str:
    """`vda`, ..., `vdz`, `vdaa`: the kernel's naming of the index-th disk on a bus."""
    letters = ""
    index += 1
    while index:
        index, remainder = divmod(index - 1, 26)
        letters = chr(ord("a") + remainder) + letters
    return prefix + letters


def disk_bus(disk: Disk) -> str:
    if disk.cdrom is not None:
        return disk.cdrom.bus or DISK_BUS
    if disk.lun is not None:
        return disk.lun.bus or defaults.LUN_BUS
    return disk.disk.bus if disk.disk is not None and disk.disk.bus else DISK_BUS


def configure_disks(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    volumes = {volume.name: volume for volume in spec.volumes}
    used: dict[str, int] = {}
    for disk in vmi_disks(spec.domain.devices, spec.volumes):
        bus = disk_bus(disk)
        prefix = "vd" if bus == "virtio" else "sd"
        target = device_name(prefix, used.get(prefix, 0))
        used[prefix] = used.get(prefix, 0) + 1
        volume = volumes[disk.name]
        _add_disk(child(domain, "devices"), disk, bus, target, volume_source(ctx, volume),
                  readonly=_readonly(disk, volume))


def _readonly(disk: Disk, volume: Volume) -> bool:
    if volume.downward_metrics is not None:
        return True
    if disk.cdrom is not None:
        return disk.cdrom.readonly is not False
    if disk.lun is not None:
        return disk.lun.readonly
    return disk.disk is not None and disk.disk.readonly


def _add_disk(devices: Element, disk: Disk, bus: str, target: str, source: DiskSource,
              *, readonly: bool) -> None:
    cdrom, lun = disk.cdrom, disk.lun
    if lun is not None:
        element = sub(devices, "disk", type="block", device="lun")
    else:
        element = sub(devices, "disk", type="file",
                      device="cdrom" if cdrom is not None else "disk")
    driver = sub(element, "driver", name="qemu", type=source.format)
    if disk.cache:
        driver.set("cache", disk.cache)
    if lun is None:
        sub(element, "source", file=source.path)
    else:
        source_element = sub(element, "source", dev=source.path)
        if lun.reservation:
            reservations = sub(source_element, "reservations", managed="no")
            sub(reservations, "source", type="unix", path=defaults.PR_HELPER_SOCKET,
                mode="client")
    target_element = sub(element, "target", dev=target, bus=bus)
    if cdrom is not None and cdrom.tray:
        target_element.set("tray", cdrom.tray)
    if readonly:
        sub(element, "readonly")
    if disk.serial:
        sub(element, "serial", disk.serial)
    if disk.boot_order is not None:
        sub(element, "boot", order=disk.boot_order)
    sub(element, "alias", name=f"ua-{disk.name}")
