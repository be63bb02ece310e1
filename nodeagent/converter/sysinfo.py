"""`<sysinfo type='smbios'>`: what the guest reads from SMBIOS (dmidecode).

KubeVirt always publishes a system table (manufacturer, product, family) and adds the
firmware `uuid` and `serial` when set, so a guest sees the same identity on every host.
`domain.chassis` adds a chassis table (manufacturer, version, serial, asset, sku).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from nodeagent.converter import defaults
from nodeagent.converter.xmltree import child, sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_sysinfo(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    firmware = spec.domain.firmware
    entries = {
        "manufacturer": defaults.SMBIOS_MANUFACTURER,
        "product": defaults.SMBIOS_PRODUCT,
        "family": defaults.SMBIOS_FAMILY,
        "serial": firmware.serial if firmware is not None else "",
        "uuid": firmware.uuid if firmware is not None else "",
    }
    sysinfo = sub(domain, "sysinfo", type="smbios")
    system = sub(sysinfo, "system")
    for name, value in entries.items():
        if value:
            sub(system, "entry", value, name=name)
    chassis = spec.domain.chassis
    if chassis is not None:
        table = sub(sysinfo, "chassis")
        for name, value in msgspec.structs.asdict(chassis).items():
            if value:
                sub(table, "entry", value, name=name)
    sub(child(domain, "os"), "smbios", mode="sysinfo")
