"""The converter: configurators, each owning one part of the domain, run in order."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import TYPE_CHECKING

from nodeagent.converter.channels import configure_channels
from nodeagent.converter.clock import configure_clock
from nodeagent.converter.console import configure_console
from nodeagent.converter.controllers import configure_controllers
from nodeagent.converter.cpu import configure_cpu
from nodeagent.converter.disks import configure_disks
from nodeagent.converter.features import configure_features
from nodeagent.converter.firmware import configure_boot_menu, configure_firmware
from nodeagent.converter.graphics import configure_graphics
from nodeagent.converter.identity import configure_identity
from nodeagent.converter.inputs import configure_inputs
from nodeagent.converter.interfaces import configure_interfaces
from nodeagent.converter.iothreads import configure_iothreads
from nodeagent.converter.kernelboot import configure_kernel_boot
from nodeagent.converter.machine import configure_machine
from nodeagent.converter.maxmemory import configure_max_memory
from nodeagent.converter.memory import configure_memory
from nodeagent.converter.rng import configure_balloon, configure_rng
from nodeagent.converter.sysinfo import configure_sysinfo
from nodeagent.converter.tpm import configure_tpm
from nodeagent.converter.unavailable import refuse_unmet_needs
from nodeagent.converter.watchdog import configure_watchdog
from nodeagent.converter.xmltree import render

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element

Configurator = Callable[["VMISpecLike", "ConverterContext", "Element"], None]

CONFIGURATORS: tuple[Configurator, ...] = (
    refuse_unmet_needs,
    configure_identity,
    configure_memory,
    configure_max_memory,
    configure_cpu,
    configure_machine,
    configure_firmware,
    configure_boot_menu,
    configure_kernel_boot,
    configure_sysinfo,
    configure_features,
    configure_clock,
    configure_disks,
    configure_controllers,
    configure_iothreads,
    configure_interfaces,
    configure_console,
    configure_channels,
    configure_inputs,
    configure_graphics,
    configure_balloon,
    configure_rng,
    configure_tpm,
    configure_watchdog,
)
"""Order matters only within shared parents: `<os>` wants type, loader, nvram, kernel,
initrd, cmdline, smbios; I/O threads go onto the disks and scsi controller once they exist."""


def convert(spec: VMISpecLike, ctx: ConverterContext) -> str:
    """Domain XML for an admitted VMI spec (run `validate_vmi_spec` first)."""
    domain = ET.Element("domain", type=ctx.domain_type)
    for configure in CONFIGURATORS:
        configure(spec, ctx, domain)
    return render(domain)
