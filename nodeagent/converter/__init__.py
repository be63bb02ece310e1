"""VMI spec -> libvirt domain XML, as KubeVirt's virt-launcher converter does it."""

from __future__ import annotations

from nodeagent.converter.context import ConverterContext, DomainType
from nodeagent.converter.disks import DiskSource, volume_source
from nodeagent.converter.pipeline import convert

__all__ = [
    "ConverterContext",
    "DiskSource",
    "DomainType",
    "convert",
    "volume_source",
]
