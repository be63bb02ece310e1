"""What KubeVirt admits but no virtbus node can give a guest: the launch fails, naming it.

A domain without the device, or with its memory not where the spec pinned it, would be a
different machine than the one asked for, so the agent does not start one. Its launch
fails with `NotOnThisNode`, whose message is the VMI's Failed reason (`launch failed: …`).

| spec field                                     | why                                        |
|------------------------------------------------|--------------------------------------------|
| `domain.devices.interfaces[i].sriov`           | nodes plug tap devices only, no SR-IOV VF  |
| `domain.devices.gpus[i]`                       | no device plugin hands out GPUs here       |
| `domain.devices.hostDevices[i]`                | no device plugin hands out host devices    |
| `domain.cpu.numa.guestMappingPassthrough`      | host NUMA cells are not mapped to the guest|

GPUs and host devices ask the scheduler for their `deviceName` (`events.api.resources`),
which no virtbus node advertises: such a VMI stays Pending, Unschedulable, before it could
reach this check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from events.errors import VirtbusError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


class NotOnThisNode(VirtbusError):
    """The VMI is valid, but this node cannot run it as specified."""


def missing_capabilities(spec: VMISpecLike) -> Iterator[str]:
    """`field: why` for each part of `spec` no virtbus node provides."""
    devices = spec.domain.devices
    for index, interface in enumerate(devices.interfaces):
        if interface.sriov is not None:
            yield (f"spec.domain.devices.interfaces[{index}].sriov: this node has no SR-IOV "
                   f"virtual function for interface {interface.name!r}")
    for index, gpu in enumerate(devices.gpus):
        yield (f"spec.domain.devices.gpus[{index}]: this node has no {gpu.device_name!r} "
               f"device to pass through as GPU {gpu.name!r}")
    for index, device in enumerate(devices.host_devices):
        yield (f"spec.domain.devices.hostDevices[{index}]: this node has no "
               f"{device.device_name!r} device to pass through as {device.name!r}")
    cpu = spec.domain.cpu
    if cpu is not None and cpu.numa is not None and cpu.numa.guest_mapping_passthrough is not None:
        yield ("spec.domain.cpu.numa.guestMappingPassthrough: this node does not map host "
               "NUMA cells to guests")


def refuse_missing_capabilities(spec: VMISpecLike, ctx: ConverterContext,
                                domain: Element) -> None:
    """First in the pipeline: nothing is rendered for a guest this node cannot run."""
    missing = list(missing_capabilities(spec))
    if missing:
        raise NotOnThisNode("; ".join(missing))
