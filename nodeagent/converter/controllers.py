"""`<controller>`s the chosen buses need, and none that they do not.

As in KubeVirt: a virtio-scsi controller when a disk sits on scsi, and a USB controller,
`qemu-xhci` when an input or disk uses USB, else switched off (`model='none'`), which
saves guest memory and an emulated device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from events.api.vmi_defaults import vmi_disks
from nodeagent.converter import defaults
from nodeagent.converter.disks import disk_bus
from nodeagent.converter.xmltree import child, sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_controllers(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    devices_spec = spec.domain.devices
    buses = {disk_bus(disk) for disk in vmi_disks(devices_spec, spec.volumes)}
    buses |= {device.bus or defaults.INPUT_BUS for device in devices_spec.inputs}
    devices = child(domain, "devices")
    usb_model = defaults.USB_CONTROLLER_MODEL if "usb" in buses else "none"
    sub(devices, "controller", type="usb", index=0, model=usb_model)
    if "scsi" in buses:
        sub(devices, "controller", type="scsi", index=0, model="virtio-scsi")
