"""`<disk>` devices: each `spec.domain.devices.disks[]` entry backed by its volume.

Every volume becomes a file the agent prepares under the VMI's disk directory
(`ConverterContext.disk_path`); `volume_source` is the one place that names it:

| volume source           | file                  | format |
|-------------------------|-----------------------|--------|
| containerDisk           | `<volume>.qcow2`      | qcow2 (overlay on the image) |
| emptyDisk               | `<volume>.qcow2`      | qcow2  |
| persistentVolumeClaim   | `<volume>.img`        | raw    |
| dataVolume              | `<volume>.img`        | raw    |
| cloudInitNoCloud        | `<volume>.iso`        | raw (NoCloud ISO) |

Target names follow the bus as in KubeVirt: `vdX` on virtio, `sdX` on sata/scsi/usb.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

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
    if volume.cloud_init_no_cloud is not None:
        extension, image_format = ".iso", "raw"
    elif volume.container_disk is not None or volume.empty_disk is not None:
        extension, image_format = ".qcow2", "qcow2"
    else:
        extension, image_format = ".img", "raw"
    return DiskSource(os.path.join(ctx.disk_path, volume.name + extension), image_format)


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
        return disk.cdrom.bus or defaults.CDROM_BUS
    return disk.disk.bus if disk.disk is not None and disk.disk.bus else defaults.DISK_BUS


def configure_disks(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    volumes = {volume.name: volume for volume in spec.volumes}
    used: dict[str, int] = {}
    for disk in spec.domain.devices.disks:
        bus = disk_bus(disk)
        prefix = "vd" if bus == "virtio" else "sd"
        target = device_name(prefix, used.get(prefix, 0))
        used[prefix] = used.get(prefix, 0) + 1
        _add_disk(
            child(domain, "devices"), disk, bus, target, volume_source(ctx, volumes[disk.name])
        )


def _add_disk(devices: Element, disk: Disk, bus: str, target: str, source: DiskSource) -> None:
    cdrom = disk.cdrom
    element = sub(devices, "disk", type="file", device="cdrom" if cdrom is not None else "disk")
    driver = sub(element, "driver", name="qemu", type=source.format)
    if disk.cache:
        driver.set("cache", disk.cache)
    sub(element, "source", file=source.path)
    target_element = sub(element, "target", dev=target, bus=bus)
    if cdrom is not None and cdrom.tray:
        target_element.set("tray", cdrom.tray)
    readonly = (
        cdrom.readonly is not False
        if cdrom is not None
        else bool(disk.disk and disk.disk.readonly)
    )
    if readonly:
        sub(element, "readonly")
    if disk.serial:
        sub(element, "serial", disk.serial)
    if disk.boot_order is not None:
        sub(element, "boot", order=disk.boot_order)
    sub(element, "alias", name=f"ua-{disk.name}")
