"""Admission rules for a VMI spec: what KubeVirt's validating webhook refuses, refused here.

Every rule raises `InvalidSpec(field, rule)` with the JSON path of the offending field,
so a person can find it in the manifest they wrote. Checks stop at the first broken rule.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import posixpath
import re
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from events.api.errors import InvalidSpec
from events.api.names import (
    DNS1123_LABEL,
    DNS1123_LABEL_MAX,
    DNS1123_LABEL_RULE,
    DNS1123_SUBDOMAIN,
    DNS1123_SUBDOMAIN_MAX,
)
from events.api.resources import cpu_topology, quantity
from events.api.vmi_defaults import DISK_BUS

if TYPE_CHECKING:
    from collections.abc import Iterable
    from decimal import Decimal

    from events.api.domain import (
        CPU,
        GPU,
        Clock,
        Devices,
        Disk,
        DomainSpec,
        FeatureHyperv,
        Features,
        Firmware,
        HostDevice,
        HostDiskSource,
        Interface,
        KernelBoot,
        Quantity,
        Volume,
    )
    from events.api.vm import PodDNSConfig

EMULATED_MACHINES = ("q35*", "pc-q35*")
"""KubeVirt's default amd64 `emulatedMachines` (the HyperConverged leaves them unset): the
machine types a VMI may ask for, as shell patterns. q35 only: KubeVirt supports no i440fx."""
START_PAUSED = "Paused"
"""The one `startStrategy` KubeVirt knows: the guest is created paused."""
CPU_FEATURE_POLICIES = ("force", "require", "optional", "disable", "forbid")
INPUT_TYPES = ("tablet",)
INPUT_BUSES = ("virtio", "usb")
DISK_BUSES = ("virtio", "sata", "scsi", "usb")
CDROM_BUSES = ("sata", "scsi", "usb")
LUN_BUSES = ("scsi",)
"""SCSI passthrough (`device='lun'`) and persistent reservations (QEMU's scsi-block with a
pr-manager) need a SCSI controller: virtbus takes scsi only, and defaults to it, where KubeVirt
lists more buses and defaults an unset one to sata on amd64 as for any disk."""
LUN_VOLUME_SOURCES = "dataVolume or persistentVolumeClaim"
"""A LUN is a block device: only a claim can be one (KubeVirt's rule)."""
HUGEPAGE_SIZES = ("2Mi", "1Gi")
"""The x86_64 sizes a node can pre-allocate; any other size can never be scheduled."""
TICK_POLICIES = {
    "hpet": ("delay", "catchup", "merge", "discard"),
    "pit": ("delay", "catchup", "discard"),
    "rtc": ("delay", "catchup"),
}
RTC_TRACKS = ("guest", "wall")
MIN_SPINLOCK_RETRIES = 4096
MAX_VENDORID_LENGTH = 12
HYPERV_REQUIRES = {
    "synic": "vpindex",
    "synictimer": "synic",
    "ipi": "vpindex",
    "tlbflush": "vpindex",
    "evmcs": "vapic",
}
"""Hyper-V enlightenments that QEMU refuses without another (KubeVirt's dependency list)."""
IO_THREADS_POLICIES = ("shared", "auto", "supplementalPool")
VIDEO_TYPES = ("vga", "cirrus", "virtio", "ramfb", "bochs")
"""The video models KubeVirt admits on amd64."""
WATCHDOG_ACTIONS = ("poweroff", "reset", "shutdown")
DNS_POLICIES = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
MAX_DNS_NAMESERVERS = 3
MAX_DNS_SEARCH_PATHS = 6
MAX_DNS_SEARCH_LIST_CHARS = 256
PORT_PROTOCOLS = ("TCP", "UDP")
PORT_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
PORT_NAME_MAX = 15

INTERFACE_NAME = re.compile(r"[A-Za-z0-9_-]+")
INTERFACE_NAME_RULE = "can only contain letters, digits, dashes (-) or underscores (_)"
"""KubeVirt's rule for an interface's name; a network is paired with the interface of its
name, so it holds for network names too."""


class VMISpecLike(Protocol):
    """The parts of `VirtualMachineInstanceSpec` these rules read."""

    @property
    def domain(self) -> DomainSpec: ...

    @property
    def volumes(self) -> list[Volume]: ...

    @property
    def networks(self) -> list[dict[str, Any]]: ...

    @property
    def termination_grace_period_seconds(self) -> int | None: ...

    @property
    def dns_policy(self) -> str: ...

    @property
    def dns_config(self) -> PodDNSConfig | None: ...


    @property
    def start_strategy(self) -> str: ...

    @property
    def liveness_probe(self) -> dict[str, Any] | None: ...


def validate_vmi_spec(spec: VMISpecLike, path: str = "spec") -> None:
    """Refuse a spec KubeVirt would refuse; `path` prefixes every reported field."""
    grace = spec.termination_grace_period_seconds
    _require(
        grace is None or grace >= 0,
        f"{path}.terminationGracePeriodSeconds",
        "must not be negative",
    )
    _validate_start_strategy(spec, path)
    domain, at = spec.domain, f"{path}.domain"
    _validate_resources(domain, at)
    _validate_memory(domain, at)
    if domain.machine is not None and domain.machine.type:
        _validate_machine_type(domain.machine.type, f"{at}.machine.type")
    if domain.cpu is not None:
        _validate_cpu(domain.cpu, f"{at}.cpu")
        _validate_numa(domain, at)
        _validate_max_sockets(domain, f"{at}.cpu")
    if domain.firmware is not None:
        _validate_firmware(domain.firmware, domain.features, f"{at}.firmware")
    if domain.clock is not None:
        _validate_clock(domain.clock, f"{at}.clock")
    if domain.features is not None and domain.features.hyperv is not None:
        _validate_hyperv(domain.features.hyperv, f"{at}.features.hyperv")
        _require(domain.features.hyperv_passthrough is None, f"{at}.features.hypervPassthrough",
                 f"cannot be set together with {at}.features.hyperv: use one or the other")
    _validate_devices(domain.devices, f"{at}.devices")
    _validate_io_threads(domain, at)
    _validate_volumes(domain.devices, spec.volumes, path)
    _validate_networks(spec.networks, f"{path}.networks")
    _validate_ports(domain.devices.interfaces, spec.networks, f"{at}.devices.interfaces")
    _validate_dns(spec.dns_policy, spec.dns_config, path)


def _validate_start_strategy(spec: VMISpecLike, path: str) -> None:
    field = f"{path}.startStrategy"
    if spec.start_strategy:
        _one_of(spec.start_strategy, (START_PAUSED,), field)
        _require(
            spec.liveness_probe is None,
            field,
            f"a paused start cannot be combined with {path}.livenessProbe",
        )


def _validate_machine_type(machine_type: str, field: str) -> None:
    _require(
        any(fnmatch.fnmatchcase(machine_type, pattern) for pattern in EMULATED_MACHINES),
        field,
        f"must match one of the emulated machines {', '.join(EMULATED_MACHINES)}; "
        f"got {machine_type!r}",
    )


def _validate_max_sockets(domain: DomainSpec, at: str) -> None:
    """Hot-plug adds sockets up to maxSockets: the sockets the VMI starts with must fit."""
    max_sockets = domain.cpu.max_sockets if domain.cpu is not None else 0
    sockets = cpu_topology(domain).sockets
    _require(
        not max_sockets or sockets <= max_sockets,
        f"{at}.sockets",
        f"must not be greater than {at}.maxSockets ({sockets} > {max_sockets})",
    )


def _require(ok: bool, field: str, rule: str) -> None:
    if not ok:
        raise InvalidSpec(field, rule)


def _parsed(value: Quantity, field: str) -> Decimal:
    try:
        return quantity(value)
    except ValueError:
        raise InvalidSpec(field, "must be a quantity such as 512Mi, 2Gi or 2") from None


def _one_of(value: str, allowed: Iterable[str], field: str) -> None:
    allowed = tuple(allowed)
    _require(value in allowed, field, f"must be one of {', '.join(allowed)}; got {value!r}")


def _dns1123_label(name: str, field: str) -> None:
    """Volume names, as Kubernetes requires of a pod's volume names (KubeVirt's API says so of
    a VMI's, and makes launcher pod volumes of them); a disk's name is its volume's. The
    agent makes host files of them (`<volume>.img`), so nothing else may pass."""
    _require(
        len(name) <= DNS1123_LABEL_MAX and DNS1123_LABEL.fullmatch(name) is not None,
        field,
        f"{DNS1123_LABEL_RULE}; got {name!r}",
    )


def _interface_name(name: object, field: str) -> None:
    _require(
        isinstance(name, str) and INTERFACE_NAME.fullmatch(name) is not None,
        field,
        f"{INTERFACE_NAME_RULE}; got {name!r}",
    )


def _unique(names: list[str], field: str) -> None:
    """`field` is a format string taking the list index of the first repeated name."""
    seen: set[str] = set()
    for index, name in enumerate(names):
        _require(name not in seen, field.format(index), f"name {name!r} is used twice")
        seen.add(name)


# --- resources and memory ----------------------------------------------------------------


def _validate_resources(domain: DomainSpec, at: str) -> None:
    resources, at = domain.resources, f"{at}.resources"
    limits = {k: _parsed(v, f"{at}.limits.{k}") for k, v in resources.limits.items()}
    for key, value in resources.requests.items():
        request = _parsed(value, f"{at}.requests.{key}")
        if key in limits:
            _require(
                request <= limits[key],
                f"{at}.requests.{key}",
                f"must be less than or equal to {at}.limits.{key}",
            )


def _validate_memory(domain: DomainSpec, at: str) -> None:
    resources, memory = domain.resources, domain.memory
    guest = memory.guest if memory is not None else None
    requested = guest if guest is not None else resources.requests.get("memory")
    requested = requested if requested is not None else resources.limits.get("memory")
    if requested is None:
        raise InvalidSpec(f"{at}.resources.requests.memory", f"must be set, or {at}.memory.guest")
    size = _parsed(requested, f"{at}.memory.guest")
    _require(size > 0, f"{at}.memory.guest", "guest memory must be greater than zero")
    limit = resources.limits.get("memory")
    if guest is not None and limit is not None:
        _require(
            size <= quantity(limit),
            f"{at}.memory.guest",
            f"must be less than or equal to {at}.resources.limits.memory",
        )
    if memory is not None and memory.hugepages is not None:
        _validate_hugepages(memory.hugepages.page_size, size, f"{at}.memory.hugepages.pageSize")
    if memory is not None and memory.max_guest is not None:
        _require(
            _parsed(memory.max_guest, f"{at}.memory.maxGuest") >= size,
            f"{at}.memory.maxGuest",
            f"must be greater than or equal to {at}.memory.guest",
        )


def _validate_hugepages(page_size: str, memory: Decimal, field: str) -> None:
    """The seed's three hugepages limitations."""
    page = _parsed(page_size, field)
    _require(
        page_size in HUGEPAGE_SIZES,
        field,
        f"must be a hugepage size nodes pre-allocate ({', '.join(HUGEPAGE_SIZES)})",
    )
    _require(page <= memory, field, "hugepages size cannot be bigger than requested memory")
    _require(memory % page == 0, field, "requested memory must be divisible by hugepages size")


# --- cpu, firmware, clock, features --------------------------------------------------------


def _validate_cpu(cpu: CPU, at: str) -> None:
    counts = {
        "cores": cpu.cores,
        "sockets": cpu.sockets,
        "threads": cpu.threads,
        "maxSockets": cpu.max_sockets,
    }
    for name, count in counts.items():
        _require(count >= 0, f"{at}.{name}", "must not be negative")
    for index, feature in enumerate(cpu.features):
        _require(bool(feature.name), f"{at}.features[{index}].name", "must not be empty")
        if feature.policy:
            _one_of(feature.policy, CPU_FEATURE_POLICIES, f"{at}.features[{index}].policy")
    _unique([f.name for f in cpu.features], f"{at}.features[{{}}].name")
    _require(
        cpu.dedicated_cpu_placement or not cpu.isolate_emulator_thread,
        f"{at}.isolateEmulatorThread",
        f"requires {at}.dedicatedCpuPlacement",
    )


def _validate_numa(domain: DomainSpec, at: str) -> None:
    """Guest NUMA passthrough mirrors host cells: it needs pinned CPUs and hugepages."""
    cpu = domain.cpu
    if cpu is None or cpu.numa is None or cpu.numa.guest_mapping_passthrough is None:
        return
    field = f"{at}.cpu.numa.guestMappingPassthrough"
    _require(cpu.dedicated_cpu_placement, field,
             f"requires {at}.cpu.dedicatedCpuPlacement to be true")
    _require(domain.memory is not None and domain.memory.hugepages is not None, field,
             f"requires {at}.memory.hugepages")


def _smm_enabled(features: Features | None) -> bool:
    return features is not None and features.smm is not None and features.smm.enabled is not False


def _validate_firmware(firmware: Firmware, features: Features | None, at: str) -> None:
    if firmware.uuid:
        try:
            uuid.UUID(firmware.uuid)
        except ValueError:
            raise InvalidSpec(f"{at}.uuid", "must be a UUID") from None
    if firmware.kernel_boot is not None:
        _validate_kernel_boot(firmware.kernel_boot, f"{at}.kernelBoot")
    loader = firmware.bootloader
    if loader is None:
        return
    _require(
        loader.bios is None or loader.efi is None,
        f"{at}.bootloader",
        "must set either bios or efi, not both",
    )
    if loader.efi is not None and loader.efi.secure_boot:
        _require(
            _smm_enabled(features),
            f"{at}.bootloader.efi.secureBoot",
            "SecureBoot requires SMM: enable spec.domain.features.smm",
        )


def _validate_kernel_boot(kernel_boot: KernelBoot, at: str) -> None:
    container = kernel_boot.container
    if container is None:
        _require(not kernel_boot.kernel_args, f"{at}.kernelArgs",
                 "kernel arguments cannot be provided without an external kernel")
        return
    _require(bool(container.image), f"{at}.container.image", "must be set")
    _require(bool(container.kernel_path or container.initrd_path), f"{at}.container",
             "must set at least one of kernelPath, initrdPath")
    for name, path in (("kernelPath", container.kernel_path),
                       ("initrdPath", container.initrd_path)):
        if path:
            _absolute_file_path(path, f"{at}.container.{name}")


def _absolute_file_path(path: str, field: str) -> None:
    """KubeVirt's ValidatePath: absolute, not the root, no `.`/`..` or doubled slashes."""
    _require(path != "/", field, "must not point to root")
    _require(posixpath.normpath("///" + path) == path.rstrip("/"), field,
             "must be an absolute path to a file without relative components")


def _validate_clock(clock: Clock, at: str) -> None:
    _require(
        clock.utc is None or clock.timezone is None,
        at,
        "must set either utc or timezone, not both",
    )
    timer = clock.timer
    if timer is None:
        return
    for name, ticking in (("hpet", timer.hpet), ("pit", timer.pit), ("rtc", timer.rtc)):
        if ticking is not None and ticking.tick_policy:
            _one_of(ticking.tick_policy, TICK_POLICIES[name], f"{at}.timer.{name}.tickPolicy")
    if timer.rtc is not None and timer.rtc.track:
        _one_of(timer.rtc.track, RTC_TRACKS, f"{at}.timer.rtc.track")


def _validate_hyperv(hyperv: FeatureHyperv, at: str) -> None:
    spinlocks = hyperv.spinlocks
    if spinlocks is not None and spinlocks.spinlocks is not None:
        _require(
            spinlocks.spinlocks >= MIN_SPINLOCK_RETRIES,
            f"{at}.spinlocks.spinlocks",
            f"must be at least {MIN_SPINLOCK_RETRIES}",
        )
    if hyperv.vendorid is not None:
        _require(
            len(hyperv.vendorid.vendorid) <= MAX_VENDORID_LENGTH,
            f"{at}.vendorid.vendorid",
            f"must be at most {MAX_VENDORID_LENGTH} characters",
        )
    for feature, required in HYPERV_REQUIRES.items():
        wanted = getattr(hyperv, feature)
        needed = getattr(hyperv, required)
        _require(
            wanted is None
            or wanted.enabled is False
            or needed is None
            or needed.enabled is not False,
            f"{at}.{feature}",
            f"requires {at}.{required}, which is disabled",
        )


# --- devices and volumes -------------------------------------------------------------------


def _validate_devices(devices: Devices, at: str) -> None:
    _validate_video_and_watchdog(devices, at)
    ramfb_displays = [
        gpu.name for gpu in devices.gpus
        if (options := gpu.virtual_gpu_options) is not None and options.display is not None
        and options.display.enabled is not False
        and (options.display.ram_fb is None or options.display.ram_fb.enabled is not False)
    ]
    _require(len(ramfb_displays) <= 1, f"{at}.gpus",
             f"configuring multiple displays with ramfb is not valid: {ramfb_displays}")
    passed: list[tuple[str, GPU | HostDevice]] = [
        (f"gpus[{i}]", gpu) for i, gpu in enumerate(devices.gpus)]
    passed += [(f"hostDevices[{i}]", host) for i, host in enumerate(devices.host_devices)]
    for where, passthrough in passed:
        _validate_device_source(passthrough, f"{at}.{where}")
    for index, device in enumerate(devices.inputs):
        field = f"{at}.inputs[{index}]"
        _require(bool(device.name), f"{field}.name", "must not be empty")
        _one_of(device.type, INPUT_TYPES, f"{field}.type")
        if device.bus:
            _one_of(device.bus, INPUT_BUSES, f"{field}.bus")
    _unique([i.name for i in devices.inputs], f"{at}.inputs[{{}}].name")
    for index, interface in enumerate(devices.interfaces):
        _interface_name(interface.name, f"{at}.interfaces[{index}].name")
    _unique([i.name for i in devices.interfaces], f"{at}.interfaces[{{}}].name")
    for index, interface in enumerate(devices.interfaces):
        bindings = (interface.masquerade, interface.bridge, interface.sriov)
        _require(sum(b is not None for b in bindings) == 1, f"{at}.interfaces[{index}]",
                 "must have exactly one binding method: masquerade, bridge or sriov")
    _unique([d.name for d in devices.disks], f"{at}.disks[{{}}].name")
    boot_orders: set[int] = set()
    for index, disk in enumerate(devices.disks):
        field = f"{at}.disks[{index}]"
        _require(
            sum(device is not None for device in (disk.disk, disk.cdrom, disk.lun)) <= 1,
            field,
            "must set only one of disk, cdrom or lun (none is a disk)",
        )
        if disk.disk is not None and disk.disk.bus:
            _one_of(disk.disk.bus, DISK_BUSES, f"{field}.disk.bus")
        if disk.cdrom is not None and disk.cdrom.bus:
            _one_of(disk.cdrom.bus, CDROM_BUSES, f"{field}.cdrom.bus")
        if disk.lun is not None and disk.lun.bus:
            _one_of(disk.lun.bus, LUN_BUSES, f"{field}.lun.bus")
        if disk.boot_order is not None:
            _require(disk.boot_order > 0, f"{field}.bootOrder", "must be greater than zero")
            _require(
                disk.boot_order not in boot_orders,
                f"{field}.bootOrder",
                f"boot order {disk.boot_order} is used by another disk",
            )
            boot_orders.add(disk.boot_order)


def _validate_video_and_watchdog(devices: Devices, at: str) -> None:
    if devices.video is not None:
        _require(devices.autoattach_graphics_device is not False, f"{at}.video",
                 "is not allowed when autoattachGraphicsDevice is set to false")
        _one_of(devices.video.type, VIDEO_TYPES, f"{at}.video.type")
    watchdog = devices.watchdog
    if watchdog is None:
        return
    _require(watchdog.diag288 is None, f"{at}.watchdog",
             "amd64 only supports the i6300esb watchdog device")
    if watchdog.i6300esb is not None and watchdog.i6300esb.action:
        _one_of(watchdog.i6300esb.action, WATCHDOG_ACTIONS, f"{at}.watchdog.i6300esb.action")


def _validate_io_threads(domain: DomainSpec, at: str) -> None:
    policy = domain.io_threads_policy
    if policy is None:
        return
    _one_of(policy, IO_THREADS_POLICIES, f"{at}.ioThreadsPolicy")
    if policy == "supplementalPool":
        count = domain.io_threads.supplemental_pool_thread_count \
            if domain.io_threads is not None else None
        _require(count is not None and count >= 1,
                 f"{at}.ioThreads.supplementalPoolThreadCount",
                 "must be set and positive for the supplementalPool policy")


def _validate_volumes(devices: Devices, volumes: list[Volume], path: str) -> None:
    for index, volume in enumerate(volumes):
        _dns1123_label(volume.name, f"{path}.volumes[{index}].name")
    _unique([v.name for v in volumes], f"{path}.volumes[{{}}].name")
    by_name = {v.name: v for v in volumes}
    for index, disk in enumerate(devices.disks):
        field = f"{path}.domain.devices.disks[{index}]"
        _dns1123_label(disk.name, f"{field}.name")
        _require(
            disk.name in by_name,
            f"{field}.name",
            f"must match the name of a volume in {path}.volumes",
        )
        _validate_disk_volume(disk, by_name[disk.name], field)
    disk_names = {d.name for d in devices.disks}
    for index, volume in enumerate(volumes):
        field = f"{path}.volumes[{index}]"
        _require(
            sum(s is not None for s in volume.sources) == 1,
            field,
            "must have exactly one volume source",
        )
        _validate_object_references(volume, field)
        _require(
            volume.name in disk_names or volume.downward_metrics is None,
            f"{field}.name",
            f"a DownwardMetrics volume must be used by a disk on the virtio bus in "
            f"{path}.domain.devices.disks (a volume without a disk gets one on {DISK_BUS})",
        )
        if volume.empty_disk is not None:
            _parsed(volume.empty_disk.capacity, f"{field}.emptyDisk.capacity")
        if volume.host_disk is not None:
            _validate_host_disk(volume.host_disk, f"{field}.hostDisk")
    service_accounts = sum(v.service_account is not None for v in volumes)
    _require(service_accounts <= 1, f"{path}.volumes",
             "must have at most one serviceAccount volume")


def _validate_device_source(device: GPU | HostDevice, field: str) -> None:
    """A device plugin's `deviceName`, or a DRA claim (`claimName` and `requestName`; its
    gate is the cluster's to check), never both."""
    if device.claim_name or device.request_name:
        _require(not device.device_name, f"{field}.deviceName",
                 "must not be set together with claimName/requestName")
        _require(bool(device.claim_name and device.request_name), field,
                 "a DRA device needs both claimName and requestName")
    else:
        _require(bool(device.device_name), f"{field}.deviceName",
                 "is required: the device plugin resource to pass through, or a DRA "
                 "claimName and requestName")


def _validate_host_disk(host_disk: HostDiskSource, field: str) -> None:
    """KubeVirt's hostDisk rules: an absolute path; a capacity exactly for DiskOrCreate."""
    _require(host_disk.path.startswith("/"), f"{field}.path", "must be an absolute path")
    if host_disk.type == "DiskOrCreate":
        _require(host_disk.capacity is not None, f"{field}.capacity",
                 "is required for type DiskOrCreate")
        if host_disk.capacity is not None:
            _parsed(host_disk.capacity, f"{field}.capacity")
    else:
        _require(host_disk.capacity is None, f"{field}.capacity",
                 "must not be set for type Disk")


def _validate_object_references(volume: Volume, field: str) -> None:
    """The Kubernetes object a config volume is made of must be named."""
    for source, name_field, name in (
        (volume.config_map, "configMap.name", volume.config_map and volume.config_map.name),
        (volume.secret, "secret.secretName", volume.secret and volume.secret.secret_name),
        (volume.service_account, "serviceAccount.serviceAccountName",
         volume.service_account and volume.service_account.service_account_name),
    ):
        if source is not None:
            _require(bool(name), f"{field}.{name_field}", "is required")


def _validate_networks(networks: list[dict[str, Any]], at: str) -> None:
    for index, network in enumerate(networks):
        _interface_name(network.get("name"), f"{at}[{index}].name")
    _unique([n["name"] for n in networks], f"{at}[{{}}].name")


def _validate_ports(interfaces: list[Interface], networks: list[dict[str, Any]],
                    at: str) -> None:
    """Forwarded ports, checked as KubeVirt checks them: on interfaces of the pod network."""
    pod_networks = {n.get("name") for n in networks if "pod" in n}
    for index, interface in enumerate(interfaces):
        if interface.name not in pod_networks:
            continue
        names: set[str] = set()
        for port_index, port in enumerate(interface.ports):
            field = f"{at}[{index}].ports[{port_index}]"
            _require(port.port != 0, f"{field}.port", "is required")
            _require(0 < port.port < 65536, f"{field}.port", "must be in range 0 < x < 65536")
            if port.protocol:
                _one_of(port.protocol, PORT_PROTOCOLS, f"{field}.protocol")
            if port.name:
                _require(port.name not in names, f"{field}.name",
                         f"duplicate name of the port: {port.name!r}")
                _require(len(port.name) <= PORT_NAME_MAX and "--" not in port.name
                         and PORT_NAME.fullmatch(port.name) is not None
                         and any(c.isalpha() for c in port.name), f"{field}.name",
                         "must be an IANA service name: at most 15 lower-case letters, digits "
                         "or single '-', with at least one letter")
                names.add(port.name)


def _validate_dns(policy: str, config: PodDNSConfig | None, path: str) -> None:
    """Kubernetes' pod DNS rules, which KubeVirt's admission applies to the VMI."""
    if policy:
        _one_of(policy, DNS_POLICIES, f"{path}.dnsPolicy")
    if policy == "None":
        _require(config is not None, f"{path}.dnsConfig",
                 "must be provided when dnsPolicy is None")
        _require(config is not None and bool(config.nameservers),
                 f"{path}.dnsConfig.nameservers",
                 "must list at least one DNS nameserver when dnsPolicy is None")
    if config is None:
        return
    at = f"{path}.dnsConfig"
    _require(len(config.nameservers) <= MAX_DNS_NAMESERVERS, f"{at}.nameservers",
             f"must not have more than {MAX_DNS_NAMESERVERS} nameservers")
    for index, nameserver in enumerate(config.nameservers):
        try:
            ipaddress.ip_address(nameserver)
        except ValueError:
            raise InvalidSpec(f"{at}.nameservers[{index}]",
                              f"must be a valid IP address; got {nameserver!r}") from None
    _require(len(config.searches) <= MAX_DNS_SEARCH_PATHS, f"{at}.searches",
             f"must not have more than {MAX_DNS_SEARCH_PATHS} search paths")
    _require(len(" ".join(config.searches)) <= MAX_DNS_SEARCH_LIST_CHARS, f"{at}.searches",
             f"must not have more than {MAX_DNS_SEARCH_LIST_CHARS} characters "
             "(including spaces) in the search list")
    for index, search in enumerate(config.searches):
        _require(len(search) <= DNS1123_SUBDOMAIN_MAX
                 and DNS1123_SUBDOMAIN.fullmatch(search) is not None,
                 f"{at}.searches[{index}]",
                 f"must be a lower-case DNS-1123 subdomain; got {search!r}")
    for index, option in enumerate(config.options):
        _require(bool(option.name), f"{at}.options[{index}].name", "must not be empty")


def _validate_disk_volume(disk: Disk, volume: Volume, field: str) -> None:
    """What a disk's device type asks of its volume, as KubeVirt's VMI admission checks it."""
    if disk.lun is not None:
        _require(
            volume.persistent_volume_claim is not None or volume.data_volume is not None,
            f"{field}.lun",
            f"can only be mapped to a {LUN_VOLUME_SOURCES} volume",
        )
    if volume.downward_metrics is None:
        return
    _require(
        disk.cdrom is None and disk.lun is None,
        f"{field}.disk",
        "DownwardMetrics volume must be used with a disk, not a cdrom or lun",
    )
    bus = disk.disk.bus if disk.disk is not None and disk.disk.bus else DISK_BUS
    _require(
        bus == "virtio",
        f"{field}.disk.bus",
        f"DownwardMetrics volume must be on the virtio bus, not {bus!r} "
        f"(a disk without a bus is on {DISK_BUS})",
    )
