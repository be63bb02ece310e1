"""`<os>` loader, NVRAM and BIOS options: how the guest boots.

| bootloader            | loader                     | nvram template        |
|-----------------------|----------------------------|-----------------------|
| absent / `bios`       | none (SeaBIOS, libvirt's)  | none                  |
| `efi` (no secureBoot) | OVMF_CODE.fd, secure='no'  | OVMF_VARS.fd          |
| `efi.secureBoot:true` | OVMF_CODE.secboot.fd, yes  | OVMF_VARS.secboot.fd  |

The seed says `efi: {}` is plain UEFI ("SecureBoot is not yet supported"), so an
absent `secureBoot` means off, unlike today's KubeVirt webhook which defaults it on.
Secure boot needs SMM, which validation requires the spec to enable.

`startStrategy: Paused` also turns the firmware's boot menu on for 10 s (KubeVirt's
`configureBootMenu`), so whoever unpauses the guest has time to reach it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from events.api.spec_rules import START_PAUSED
from nodeagent.converter import defaults
from nodeagent.converter.xmltree import child, sub, yes_no

if TYPE_CHECKING:
    from events.api.domain import EFI
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_firmware(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    firmware = spec.domain.firmware
    loader = firmware.bootloader if firmware is not None else None
    if loader is None:
        return
    os_element = child(domain, "os")
    if loader.efi is not None:
        _configure_efi(loader.efi, ctx, os_element)
    if loader.bios is not None and loader.bios.use_serial:
        sub(os_element, "bios", useserial="yes")


def configure_boot_menu(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    if spec.start_strategy == START_PAUSED:
        sub(child(domain, "os"), "bootmenu", enable="yes", timeout=defaults.BOOT_MENU_TIMEOUT_MS)


def _configure_efi(efi: EFI, ctx: ConverterContext, os_element: Element) -> None:
    secure = bool(efi.secure_boot)
    code, variables = (
        (defaults.EFI_SECURE_CODE, defaults.EFI_SECURE_VARS)
        if secure
        else (defaults.EFI_CODE, defaults.EFI_VARS)
    )
    sub(
        os_element,
        "loader",
        os.path.join(ctx.ovmf_dir, code),
        readonly="yes",
        secure=yes_no(secure, default=False),
        type="pflash",
    )
    sub(
        os_element,
        "nvram",
        ctx.disk_file(f"{ctx.name}_VARS.fd"),
        template=os.path.join(ctx.ovmf_dir, variables),
    )
