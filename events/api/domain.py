"""KubeVirt's `spec.domain` and `spec.volumes`: the virtual hardware of a VMI.

Stub owned by the converter work; field names follow kubevirt.io/v1 exactly.
"""

from __future__ import annotations

from events.api.base import ApiStruct


class CPU(ApiStruct):
    cores: int = 0
    sockets: int = 0
    threads: int = 0
    model: str = ""


class Memory(ApiStruct):
    guest: str = ""


class ResourceRequirements(ApiStruct):
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    overcommit_guest_overhead: bool = False


class Disk(ApiStruct):
    name: str
    disk: dict[str, object] | None = None
    cdrom: dict[str, object] | None = None
    boot_order: int = 0


class Interface(ApiStruct):
    name: str
    masquerade: dict[str, object] | None = None
    bridge: dict[str, object] | None = None
    mac_address: str = ""
    model: str = ""


class Devices(ApiStruct):
    disks: list[Disk] = []
    interfaces: list[Interface] = []
    autoattach_graphics_device: bool | None = None


class DomainSpec(ApiStruct):
    cpu: CPU | None = None
    memory: Memory | None = None
    resources: ResourceRequirements = ResourceRequirements()
    devices: Devices = Devices()


class Volume(ApiStruct):
    name: str
    container_disk: dict[str, object] | None = None
    persistent_volume_claim: dict[str, object] | None = None
    empty_disk: dict[str, object] | None = None
    cloud_init_no_cloud: dict[str, object] | None = None
