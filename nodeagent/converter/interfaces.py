"""`<interface>`s: one tap device per `spec.domain.devices.interfaces[]` entry.

KubeVirt plugs masquerade and bridge bindings into a tap device that virt-launcher
prepared (`type='ethernet'`, `managed='no'`), `tap<index>` in the pod's namespace. A real
host's agent makes one per interface in the host's namespace, named from the VMI's uid
(`ctx.host_interfaces`, `nodeagent.network`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeagent.converter.xmltree import child, sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element

DEFAULT_MODEL = "virtio"


def configure_interfaces(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    for index, interface in enumerate(spec.domain.devices.interfaces):
        element = sub(child(domain, "devices"), "interface", type="ethernet")
        host = ctx.host_interfaces[index] if index < len(ctx.host_interfaces) else None
        mac = host.mac if host is not None else interface.mac_address
        if mac:
            sub(element, "mac", address=mac)
        sub(element, "target", dev=host.tap if host is not None else f"tap{index}",
            managed="no")
        sub(element, "model", type=interface.model or DEFAULT_MODEL)
        if interface.boot_order is not None:
            sub(element, "boot", order=interface.boot_order)
        sub(element, "alias", name=f"ua-{interface.name}")
