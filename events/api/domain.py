"""KubeVirt's `spec.domain` and `spec.volumes`: the virtual hardware of a VMI.

Field names follow kubevirt.io/v1 exactly (ApiStruct renames snake_case to camelCase;
`name=` covers the handful KubeVirt spells otherwise, e.g. hyperv's `vpindex`).
Optional sub-objects are `None` when absent because KubeVirt gives "absent" and
"present but empty" (`rng: {}`, `utc: {}`) different meanings.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

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


class NUMAGuestMappingPassthrough(ApiStruct):
    """Mirror the host NUMA cells the guest's dedicated CPUs and hugepages come from."""


class NUMA(ApiStruct):
    guest_mapping_passthrough: NUMAGuestMappingPassthrough | None = None


class CPU(ApiStruct):
    cores: int = 0
    sockets: int = 0
    threads: int = 0
    max_sockets: int = 0
    model: str = ""
    features: list[CPUFeature] = []
    dedicated_cpu_placement: bool = False
    isolate_emulator_thread: bool = False
    numa: NUMA | None = None


# --- memory ------------------------------------------------------------------------------


class Hugepages(ApiStruct):
    page_size: str = ""


class Memory(ApiStruct):
    guest: Quantity | None = None
    max_guest: Quantity | None = None
    """The most memory the guest may be hot-plugged up to (`<maxMemory>`)."""
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


class KernelBootContainer(ApiStruct):
    """A container image holding the kernel and initrd to boot directly."""

    image: str
    image_pull_secret: str = ""
    image_pull_policy: str = ""
    kernel_path: str = ""
    initrd_path: str = ""


class KernelBoot(ApiStruct):
    kernel_args: str = ""
    container: KernelBootContainer | None = None


class Firmware(ApiStruct):
    uuid: str = ""
    serial: str = ""
    bootloader: Bootloader | None = None
    kernel_boot: KernelBoot | None = None


class Chassis(ApiStruct):
    """SMBIOS chassis table (type 3) entries."""

    manufacturer: str = ""
    version: str = ""
    serial: str = ""
    asset: str = ""
    sku: str = ""


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


class FeatureTLBFlush(ApiStruct):
    """Hyper-V TLB flush, with its direct and extended variants."""

    enabled: bool | None = None
    direct: FeatureState | None = None
    extended: FeatureState | None = None


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
    tlbflush: FeatureTLBFlush | None = None
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
    hyperv_passthrough: FeatureState | None = None
    """Every Hyper-V enlightenment the host offers (`<hyperv mode='passthrough'>`); used
    only when `hyperv` is absent, as in KubeVirt."""


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
    dedicated_io_thread: bool | None = msgspec.field(default=None, name="dedicatedIOThread")


class Port(ApiStruct):
    """A port a masquerade binding forwards to the guest (all ports when none is listed)."""

    port: int
    name: str = ""
    protocol: str = ""


class Interface(ApiStruct):
    name: str
    masquerade: Empty | None = None
    bridge: Empty | None = None
    sriov: Empty | None = None
    """An SR-IOV virtual function of the interface's network, passed through to the guest."""
    ports: list[Port] = []
    mac_address: str = ""
    model: str = ""
    boot_order: int | None = None


class Input(ApiStruct):
    name: str
    type: str
    bus: str = ""


class TPMDevice(ApiStruct):
    enabled: bool | None = None
    persistent: bool | None = None


class VideoDevice(ApiStruct):
    type: str = ""


class VGPUDisplayOptions(ApiStruct):
    enabled: bool | None = None
    ram_fb: FeatureState | None = msgspec.field(default=None, name="ramFB")


class VGPUOptions(ApiStruct):
    display: VGPUDisplayOptions | None = None


class GPU(ApiStruct):
    """A GPU (or vGPU) of a device plugin's resource `deviceName`, passed through (or of a
    DRA claim: `claimName` / `requestName`, behind GPUsWithDRA)."""

    name: str
    device_name: str = ""
    claim_name: str = ""
    request_name: str = ""
    virtual_gpu_options: VGPUOptions | None = msgspec.field(default=None,
                                                            name="virtualGPUOptions")
    tag: str = ""


class HostDevice(ApiStruct):
    """A host PCI or mediated device of a device plugin's resource `deviceName` (or of a DRA
    claim, behind HostDevicesWithDRA)."""

    name: str
    device_name: str = ""
    claim_name: str = ""
    request_name: str = ""
    tag: str = ""


class WatchdogDevice(ApiStruct):
    action: str = ""


class Watchdog(ApiStruct):
    name: str
    i6300esb: WatchdogDevice | None = None
    diag288: WatchdogDevice | None = None


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
    tpm: TPMDevice | None = None
    video: VideoDevice | None = None
    gpus: list[GPU] = []
    host_devices: list[HostDevice] = []
    watchdog: Watchdog | None = None


class DiskIOThreads(ApiStruct):
    supplemental_pool_thread_count: int | None = None


class DomainSpec(ApiStruct):
    resources: ResourceRequirements = msgspec.field(default_factory=ResourceRequirements)
    io_threads_policy: str | None = None
    io_threads: DiskIOThreads | None = None
    chassis: Chassis | None = None
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


class LocalObjectReference(ApiStruct):
    name: str = ""


class SecretVolumeSource(ApiStruct):
    secret_name: str = ""
    optional: bool | None = None
    volume_label: str = ""


class ConfigMapVolumeSource(ApiStruct):
    name: str = ""
    optional: bool | None = None
    volume_label: str = ""


class ServiceAccountVolumeSource(ApiStruct):
    service_account_name: str = ""


class SysprepSource(ApiStruct):
    """An `autounattend.xml` / `unattend.xml` for Windows setup, from a Secret or ConfigMap."""

    secret: LocalObjectReference | None = None
    config_map: LocalObjectReference | None = None


class EphemeralVolumeSource(ApiStruct):
    """A claim used read-only as the backing of a throw-away copy-on-write overlay."""

    persistent_volume_claim: PersistentVolumeClaimSource | None = None


class CloudInitConfigDriveSource(ApiStruct):
    user_data: str = ""
    user_data_base64: str = ""
    network_data: str = ""
    network_data_base64: str = ""
    secret_ref: LocalObjectReference | None = None
    network_data_secret_ref: LocalObjectReference | None = None


class HostDiskSource(ApiStruct):
    """A disk image at a path on the node (KubeVirt's `hostDisk`, behind the HostDisk gate)."""

    path: str
    type: Literal["Disk", "DiskOrCreate"]
    capacity: Quantity | None = None
    shared: bool | None = None


class Volume(ApiStruct):
    name: str
    container_disk: ContainerDiskSource | None = None
    persistent_volume_claim: PersistentVolumeClaimSource | None = None
    data_volume: DataVolumeSource | None = None
    empty_disk: EmptyDiskSource | None = None
    host_disk: HostDiskSource | None = None
    cloud_init_no_cloud: CloudInitNoCloudSource | None = None
    downward_metrics: Empty | None = None
    """`downwardMetrics: {}`: host metrics for the guest as a small read-only disk
    (DownwardMetrics feature gate)."""
    secret: SecretVolumeSource | None = None
    config_map: ConfigMapVolumeSource | None = None
    service_account: ServiceAccountVolumeSource | None = None
    sysprep: SysprepSource | None = None
    ephemeral: EphemeralVolumeSource | None = None
    cloud_init_config_drive: CloudInitConfigDriveSource | None = None

    @property
    def sources(self) -> tuple[object | None, ...]:
        """Every volume source field, set or not: a volume must set exactly one."""
        return (self.container_disk, self.persistent_volume_claim, self.data_volume,
                self.empty_disk, self.cloud_init_no_cloud, self.downward_metrics, self.secret,
                self.config_map, self.service_account, self.sysprep, self.ephemeral,
                self.cloud_init_config_drive, self.host_disk)
