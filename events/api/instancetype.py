"""instancetype.kubevirt.io: VirtualMachine{,Cluster}Instancetype and
VirtualMachine{,Cluster}Preference, as users submit them.

One schema serves the seed's v1alpha1 and v1alpha2 and current KubeVirt's v1beta1 (v1alpha2
is v1alpha1 unchanged; v1beta1 adds fields and renames the CPU topologies, and KubeVirt still
reads the deprecated spellings). Field names follow KubeVirt's JSON exactly (`name=` where
its Go tags are not camelCase, e.g. `preferredCPUTopology`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Final, Literal

import msgspec

from events.api.base import ApiStruct, ObjectMeta
from events.api.domain import (
    EFI,
    ClockOffsetUTC,
    CPUFeature,
    Empty,
    FeatureAPIC,
    FeatureHyperv,
    FeatureKVM,
    FeatureState,
    Hugepages,
    Quantity,
    Timer,
)
from events.api.errors import InvalidSpec
from events.api.kinds import Kind, declare
from events.api.names import check_dns1123_subdomain
from events.api.resources import quantity

GROUP: Final = "instancetype.kubevirt.io"
API_VERSIONS: Final = tuple(f"{GROUP}/{v}" for v in ("v1beta1", "v1alpha2", "v1alpha1"))
"""Served versions, the one KubeVirt stores and shows first."""
SHOWN_API_VERSION: Final = API_VERSIONS[0]

INSTANCETYPE: Final = "VirtualMachineInstancetype"
CLUSTER_INSTANCETYPE: Final = "VirtualMachineClusterInstancetype"
PREFERENCE: Final = "VirtualMachinePreference"
CLUSTER_PREFERENCE: Final = "VirtualMachineClusterPreference"
CLUSTER_KINDS: Final = frozenset({CLUSTER_INSTANCETYPE, CLUSTER_PREFERENCE})

CPU_TOPOLOGIES: Final = ("sockets", "cores", "threads", "spread", "any",
                         "preferSockets", "preferCores", "preferThreads", "preferSpread",
                         "preferAny")
"""v1beta1's names, then v1alpha1's (deprecated, still honoured)."""
DEFAULT_SPREAD_RATIO: Final = 2
THREADS_PER_CORE: Final = 2
"""What spreading across sockets, cores and threads puts on each core."""
MAX_OVERCOMMIT_PERCENT: Final = 100
Count = Annotated[int, msgspec.Meta(ge=0)]
"""Go's uint32: no negative counts."""
Ratio = Annotated[int, msgspec.Meta(ge=1)]
"""A spread ratio: vCPUs are divided by it."""


# --- instancetype ----------------------------------------------------------------------------


class CPUInstancetype(ApiStruct):
    guest: Count
    model: str | None = None
    dedicated_cpu_placement: bool | None = msgspec.field(default=None,
                                                         name="dedicatedCPUPlacement")
    numa: dict[str, Any] | None = None
    isolate_emulator_thread: bool | None = None
    realtime: dict[str, Any] | None = None
    max_sockets: Count | None = None


class MemoryInstancetype(ApiStruct):
    guest: Quantity
    hugepages: Hugepages | None = None
    overcommit_percent: int = 0
    max_guest: Quantity | None = None


class VirtualMachineInstancetypeSpec(ApiStruct):
    cpu: CPUInstancetype
    memory: MemoryInstancetype
    node_selector: dict[str, str] = {}
    scheduler_name: str = ""
    gpus: list[dict[str, Any]] = []
    host_devices: list[dict[str, Any]] = []
    io_threads_policy: str | None = None
    io_threads: dict[str, Any] | None = None
    launch_security: dict[str, Any] | None = None
    annotations: dict[str, str] = {}


# --- preference ------------------------------------------------------------------------------


class SpreadOptions(ApiStruct):
    across: Literal["SocketsCores", "CoresThreads", "SocketsCoresThreads"] | None = None
    ratio: Ratio | None = None


class CPUPreferences(ApiStruct):
    preferred_cpu_topology: str | None = msgspec.field(default=None,
                                                       name="preferredCPUTopology")
    spread_options: SpreadOptions | None = None
    preferred_cpu_features: list[CPUFeature] = msgspec.field(default_factory=list,
                                                             name="preferredCPUFeatures")


class DevicePreferences(ApiStruct):
    preferred_autoattach_graphics_device: bool | None = None
    preferred_autoattach_mem_balloon: bool | None = None
    preferred_autoattach_pod_interface: bool | None = None
    preferred_autoattach_serial_console: bool | None = None
    preferred_autoattach_input_device: bool | None = None
    preferred_disable_hotplug: bool | None = None
    preferred_virtual_gpu_options: dict[str, Any] | None = msgspec.field(
        default=None, name="preferredVirtualGPUOptions")
    preferred_sound_model: str = ""
    preferred_use_virtio_transitional: bool | None = None
    preferred_input_bus: str = ""
    preferred_input_type: str = ""
    preferred_disk_bus: str = ""
    preferred_lun_bus: str = ""
    preferred_cdrom_bus: str = ""
    preferred_disk_dedicated_io_thread: bool | None = None
    preferred_disk_cache: str = ""
    preferred_disk_io: str = msgspec.field(default="", name="preferredDiskIO")
    preferred_disk_block_size: dict[str, Any] | None = None
    preferred_interface_model: str = ""
    preferred_rng: Empty | None = None
    preferred_block_multi_queue: bool | None = None
    preferred_network_interface_multi_queue: bool | None = None
    preferred_tpm: dict[str, Any] | None = msgspec.field(default=None, name="preferredTPM")
    preferred_interface_masquerade: Empty | None = None
    preferred_panic_device_model: str | None = None
    preferred_video_type: str | None = None


class FeaturePreferences(ApiStruct):
    preferred_acpi: FeatureState | None = None
    preferred_apic: FeatureAPIC | None = None
    preferred_hyperv: FeatureHyperv | None = None
    preferred_kvm: FeatureKVM | None = None
    preferred_pvspinlock: FeatureState | None = None
    preferred_smm: FeatureState | None = None


class FirmwarePreferences(ApiStruct):
    preferred_use_bios: bool | None = None
    preferred_use_bios_serial: bool | None = None
    preferred_use_efi: bool | None = None
    preferred_use_secure_boot: bool | None = None
    preferred_efi: EFI | None = None


class MachinePreferences(ApiStruct):
    preferred_machine_type: str = ""


class ClockOffset(ApiStruct):
    utc: ClockOffsetUTC | None = None
    timezone: str | None = None


class ClockPreferences(ApiStruct):
    preferred_clock_offset: ClockOffset | None = None
    preferred_timer: Timer | None = None


class VolumePreferences(ApiStruct):
    preferred_storage_class_name: str = ""


class CPUPreferenceRequirement(ApiStruct):
    guest: Count


class MemoryPreferenceRequirement(ApiStruct):
    guest: Quantity


class PreferenceRequirements(ApiStruct):
    cpu: CPUPreferenceRequirement | None = None
    memory: MemoryPreferenceRequirement | None = None
    architecture: str | None = None


class VirtualMachinePreferenceSpec(ApiStruct):
    clock: ClockPreferences | None = None
    cpu: CPUPreferences | None = None
    devices: DevicePreferences | None = None
    features: FeaturePreferences | None = None
    firmware: FirmwarePreferences | None = None
    machine: MachinePreferences | None = None
    volumes: VolumePreferences | None = None
    preferred_subdomain: str | None = None
    preferred_termination_grace_period_seconds: int | None = None
    requirements: PreferenceRequirements | None = None
    annotations: dict[str, str] = {}
    prefer_spread_socket_to_core_ratio: Count = 0
    preferred_architecture: str | None = None
    preferred_launch_security: dict[str, Any] | None = None


# --- the four kinds --------------------------------------------------------------------------


class VirtualMachineInstancetype(ApiStruct):
    metadata: ObjectMeta
    spec: VirtualMachineInstancetypeSpec
    api_version: str = SHOWN_API_VERSION
    kind: Literal["VirtualMachineInstancetype"] = "VirtualMachineInstancetype"


class VirtualMachineClusterInstancetype(ApiStruct):
    metadata: ObjectMeta
    spec: VirtualMachineInstancetypeSpec
    api_version: str = SHOWN_API_VERSION
    kind: Literal["VirtualMachineClusterInstancetype"] = "VirtualMachineClusterInstancetype"


class VirtualMachinePreference(ApiStruct):
    metadata: ObjectMeta
    spec: VirtualMachinePreferenceSpec
    api_version: str = SHOWN_API_VERSION
    kind: Literal["VirtualMachinePreference"] = "VirtualMachinePreference"


class VirtualMachineClusterPreference(ApiStruct):
    metadata: ObjectMeta
    spec: VirtualMachinePreferenceSpec
    api_version: str = SHOWN_API_VERSION
    kind: Literal["VirtualMachineClusterPreference"] = "VirtualMachineClusterPreference"


InstancetypeObject = VirtualMachineInstancetype | VirtualMachineClusterInstancetype
PreferenceObject = VirtualMachinePreference | VirtualMachineClusterPreference


def preferred_topology(pref: VirtualMachinePreferenceSpec | None) -> str:
    """The preferred CPU topology in v1beta1's words (`preferCores` is `cores`); `sockets`
    when no preference says (KubeVirt's `GetPreferredTopology`)."""
    cpu = pref.cpu if pref is not None else None
    named = (cpu.preferred_cpu_topology if cpu is not None else None) or "sockets"
    return named.removeprefix("prefer").lower()


def spread_options(pref: VirtualMachinePreferenceSpec | None) -> tuple[int, str]:
    """KubeVirt's `GetSpreadOptions`: ratio 2 across sockets and cores unless preferred."""
    ratio, across = DEFAULT_SPREAD_RATIO, "SocketsCores"
    if pref is None:
        return ratio, across
    ratio = pref.prefer_spread_socket_to_core_ratio or ratio
    options = pref.cpu.spread_options if pref.cpu is not None else None
    if options is not None:
        across = options.across or across
        ratio = options.ratio if options.ratio is not None else ratio
    return ratio, across


def validate_instancetype(obj: InstancetypeObject) -> None:
    """KubeVirt's instancetype webhook (`ValidateInstanceTypeSpec`), and the quantities its
    schema parses."""
    memory = obj.spec.memory
    for field, value in (("spec.memory.guest", memory.guest),
                         ("spec.memory.maxGuest", memory.max_guest)):
        try:
            if value is not None:
                quantity(value)
        except ValueError:
            raise InvalidSpec(field, "must be a quantity such as 512Mi, 2Gi or 2") from None
    percent = memory.overcommit_percent
    if not 0 <= percent <= MAX_OVERCOMMIT_PERCENT:
        raise InvalidSpec("spec.memory.overcommitPercent",
                          f"spec.memory.overcommitPercent '{percent}': must be in range "
                          f"between 0 and {MAX_OVERCOMMIT_PERCENT}.")
    if percent and memory.hugepages is not None:
        raise InvalidSpec("spec.memory.overcommitPercent",
                          "spec.memory.overcommitPercent and spec.memory.hugepages should not "
                          "be requested together.")


def validate_preference(obj: PreferenceObject) -> None:
    """KubeVirt's preference webhook (`ValidatePreferenceSpec`)."""
    cpu = obj.spec.cpu
    topology = cpu.preferred_cpu_topology if cpu is not None else None
    if topology is not None and topology not in CPU_TOPOLOGIES:
        raise InvalidSpec("spec.cpu.preferredCPUTopology",
                          f"unknown preferredCPUTopology {topology}")
    ratio, across = spread_options(obj.spec)
    if preferred_topology(obj.spec) == "spread" and across == "CoresThreads" \
            and ratio != DEFAULT_SPREAD_RATIO:
        raise InvalidSpec("spec.cpu.spreadOptions.ratio",
                          "only a ratio of 2 (1 core 2 threads) is allowed when spreading vCPUs "
                          "over cores and threads")


def _declare(manifest: type[ApiStruct], validate: Callable[[Any], None],
             short_names: tuple[str, ...]) -> Kind:
    kind = manifest.__name__
    return declare(Kind(
        kind=kind, group=GROUP, versions=tuple(v.rpartition("/")[2] for v in API_VERSIONS),
        plural=f"{kind.lower()}s", token=kind.lower().replace("virtualmachine", "vm", 1),
        short_names=short_names, namespaced=kind not in CLUSTER_KINDS, manifest=manifest,
        name_rule=check_dns1123_subdomain, validate=validate))


VIRTUAL_MACHINE_INSTANCETYPE: Final = _declare(
    VirtualMachineInstancetype, validate_instancetype,
    ("vminstancetype", "vminstancetypes", "vmf", "vmfs"))
VIRTUAL_MACHINE_CLUSTER_INSTANCETYPE: Final = _declare(
    VirtualMachineClusterInstancetype, validate_instancetype,
    ("vmclusterinstancetype", "vmclusterinstancetypes", "vmcf", "vmcfs"))
VIRTUAL_MACHINE_PREFERENCE: Final = _declare(
    VirtualMachinePreference, validate_preference,
    ("vmpreference", "vmpreferences", "vmpref", "vmprefs", "vmp", "vmps"))
VIRTUAL_MACHINE_CLUSTER_PREFERENCE: Final = _declare(
    VirtualMachineClusterPreference, validate_preference,
    ("vmclusterpreference", "vmclusterpreferences", "vmcp", "vmcps"))
CONTROLLER_REVISION: Final = declare(Kind(
    kind="ControllerRevision", group="apps", versions=("v1",), plural="controllerrevisions",
    token="controllerrevision", name_rule=check_dns1123_subdomain))
"""The instancetype or preference a VM was expanded with, as it stood (written by virtbus
only)."""
