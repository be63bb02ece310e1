"""KubeVirt's `spec.domain` and `spec.volumes`: the virtual hardware of a VMI.

Field names follow kubevirt.io/v1 exactly (ApiStruct renames snake_case to camelCase;
`name=` covers the handful KubeVirt spells otherwise, e.g. hyperv's `vpindex`).
Optional sub-objects are `None` when absent because KubeVirt gives "absent" and
"present but empty" (`rng: {}`, `utc: {}`) different meanings.
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from events.api.base import ApiStruct

Quantity: TypeAlias = str | int | float
"""A Kubernetes quantity as written in YAML: `512M`, `2Gi`, `2`, `0.5`."""


class Empty(ApiStruct):
    """A marker object (`{}`) whose presence is the whole meaning."""


# --- resources -------------------------------------------------------------------------


class ResourceRequirements(ApiStruct):
    requests: dict[str, Quantity] = {}
    limits: dict[str, Quantity] = {}
    overcommit_guest_overhead: bool = False


# --- cpu ---------------------------------------------------------------------------------


class CPUFeature(ApiStruct):
    name: str
    policy: str = ""


class CPU(ApiStruct):
    cores: int = 0
    sockets: int = 0
    threads: int = 0
    max_sockets: int = 0
    model: str = ""
    features: list[CPUFeature] = []
    dedicated_cpu_placement: bool = False
    isolate_emulator_thread: bool = False


# --- memory ------------------------------------------------------------------------------


class Hugepages(ApiStruct):
    page_size: str = ""


class Memory(ApiStruct):
    guest: Quantity | None = None
    hugepages: Hugepages | None = None


# --- machine and firmware -----------------------------------------------------------------


class Machine(ApiStruct):
    type: str = ""


class BIOS(ApiStruct):
    use_serial: bool | None = None


class EFI(ApiStruct):
    secure_boot: bool | None = None
    persistent: bool | None = None


class Bootloader(ApiStruct):
    bios: BIOS | None = None
    efi: EFI | None = None


class Firmware(ApiStruct):
    uuid: str = ""
    serial: str = ""
    bootloader: Bootloader | None = None


# --- clock ---------------------------------------------------------------------------------


class ClockOffsetUTC(ApiStruct):
    offset_seconds: int | None = None


class TickTimer(ApiStruct):
    """hpet and pit: a tick policy and whether the timer exists at all."""

    tick_policy: str = ""
    present: bool | None = None


class RTCTimer(ApiStruct):
    tick_policy: str = ""
    present: bool | None = None
    track: str = ""


class PresenceTimer(ApiStruct):
    """kvm and hyperv clocks: only presence is configurable."""

    present: bool | None = None


class Timer(ApiStruct):
    hpet: TickTimer | None = None
    kvm: PresenceTimer | None = None
    pit: TickTimer | None = None
    rtc: RTCTimer | None = None
    hyperv: PresenceTimer | None = None


class Clock(ApiStruct):
    utc: ClockOffsetUTC | None = None
    timezone: str | None = None
    timer: Timer | None = None


# --- features ------------------------------------------------------------------------------


class FeatureState(ApiStruct):
    """`enabled` absent means on: writing the feature at all asks for it."""

    enabled: bool | None = None


class FeatureAPIC(ApiStruct):
    enabled: bool | None = None
    end_of_interrupt: bool = False


class FeatureSpinlocks(ApiStruct):
    enabled: bool | None = None
    spinlocks: int | None = None


class FeatureVendorID(ApiStruct):
    enabled: bool | None = None
    vendorid: str = ""


class SyNICTimer(ApiStruct):
    enabled: bool | None = None
    direct: FeatureState | None = None


class FeatureHyperv(ApiStruct):
    relaxed: FeatureState | None = None
    vapic: FeatureState | None = None
    spinlocks: FeatureSpinlocks | None = None
    vpindex: FeatureState | None = None
    runtime: FeatureState | None = None
    synic: FeatureState | None = None
    synictimer: SyNICTimer | None = None
    reset: FeatureState | None = None
    vendorid: FeatureVendorID | None = None
    frequencies: FeatureState | None = None
    reenlightenment: FeatureState | None = None
    tlbflush: FeatureState | None = None
    ipi: FeatureState | None = None
    evmcs: FeatureState | None = None


class FeatureKVM(ApiStruct):
    hidden: bool = False


class Features(ApiStruct):
    acpi: FeatureState = msgspec.field(default_factory=FeatureState)
    apic: FeatureAPIC | None = None
    hyperv: FeatureHyperv | None = None
    smm: FeatureState | None = None
    kvm: FeatureKVM | None = None
    pvspinlock: FeatureState | None = None


# --- devices -------------------------------------------------------------------------------


class DiskTarget(ApiStruct):
    bus: str = ""
    readonly: bool = False


class CDRomTarget(ApiStruct):
    bus: str = ""
    readonly: bool | None = None
    tray: str = ""


class LunTarget(ApiStruct):
    """A SCSI LUN passed through to the guest (`device='lun'`), backed by a block volume.

    `reservation` lets the guest issue SCSI persistent reservations through the host's
    qemu-pr-helper; it needs the PersistentReservation feature gate. KubeVirt's field is
    `lun.reservation`: the HCO seed's example spells it `reservations: true`, a field
    KubeVirt's schema does not have and this API refuses as unknown.
    """

    bus: str = ""
    readonly: bool = False
    reservation: bool = False


class Disk(ApiStruct):
    name: str
    disk: DiskTarget | None = None
    cdrom: CDRomTarget | None = None
    lun: LunTarget | None = None
    boot_order: int | None = None
    serial: str = ""
    cache: str = ""


class Interface(ApiStruct):
    name: str
    masquerade: Empty | None = None
    bridge: Empty | None = None
    mac_address: str = ""
    model: str = ""
    boot_order: int | None = None


class Input(ApiStruct):
    name: str
    type: str
    bus: str = ""


class Devices(ApiStruct):
    disks: list[Disk] = []
    interfaces: list[Interface] = []
    inputs: list[Input] = []
    rng: Empty | None = None
    downward_metrics: Empty | None = None
    """`downwardMetrics: {}`: host metrics for the guest on a virtio-serial port
    (DownwardMetrics feature gate)."""
    autoattach_graphics_device: bool | None = None
    autoattach_pod_interface: bool | None = None
    autoattach_serial_console: bool | None = None
    autoattach_mem_balloon: bool | None = None


class DomainSpec(ApiStruct):
    resources: ResourceRequirements = msgspec.field(default_factory=ResourceRequirements)
    cpu: CPU | None = None
    memory: Memory | None = None
    machine: Machine | None = None
    firmware: Firmware | None = None
    clock: Clock | None = None
    features: Features | None = None
    devices: Devices = msgspec.field(default_factory=Devices)


# --- volumes -------------------------------------------------------------------------------


class ContainerDiskSource(ApiStruct):
    image: str
    image_pull_policy: str = ""
    image_pull_secret: str = ""
    path: str = ""


class PersistentVolumeClaimSource(ApiStruct):
    claim_name: str
    read_only: bool = False
    hotpluggable: bool = False


class DataVolumeSource(ApiStruct):
    name: str
    hotpluggable: bool = False


class EmptyDiskSource(ApiStruct):
    capacity: Quantity


class CloudInitNoCloudSource(ApiStruct):
    user_data: str = ""
    user_data_base64: str = ""
    network_data: str = ""
    network_data_base64: str = ""
    secret_ref: dict[str, str] | None = None
    network_data_secret_ref: dict[str, str] | None = None


class Volume(ApiStruct):
    name: str
    container_disk: ContainerDiskSource | None = None
    persistent_volume_claim: PersistentVolumeClaimSource | None = None
    data_volume: DataVolumeSource | None = None
    empty_disk: EmptyDiskSource | None = None
    cloud_init_no_cloud: CloudInitNoCloudSource | None = None
    downward_metrics: Empty | None = None
    """`downwardMetrics: {}`: host metrics for the guest as a small read-only disk
    (DownwardMetrics feature gate)."""
