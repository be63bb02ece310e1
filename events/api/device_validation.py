"""Admission rules of a VMI spec's devices, volumes, networks and DNS: what KubeVirt's
validating webhook refuses of them (`events.api.validation` runs them in order)."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from events.api.errors import InvalidSpec
from events.api.names import (
    DNS1123_SUBDOMAIN,
    DNS1123_SUBDOMAIN_MAX,
)
from events.api.vmi_defaults import DISK_BUS

if TYPE_CHECKING:

    from events.api.domain import (
        GPU,
        Devices,
        Disk,
        DomainSpec,
        HostDevice,
        HostDiskSource,
        Interface,
        Volume,
    )
    from events.api.vm import PodDNSConfig

from events.api.spec_rules import (
    CDROM_BUSES,
    DISK_BUSES,
    DNS_POLICIES,
    INPUT_BUSES,
    INPUT_TYPES,
    IO_THREADS_POLICIES,
    LUN_BUSES,
    LUN_VOLUME_SOURCES,
    MAX_DNS_NAMESERVERS,
    MAX_DNS_SEARCH_LIST_CHARS,
    MAX_DNS_SEARCH_PATHS,
    PORT_NAME,
    PORT_NAME_MAX,
    PORT_PROTOCOLS,
    VIDEO_TYPES,
    WATCHDOG_ACTIONS,
    dns1123_label,
    interface_name,
    one_of,
    parsed,
    require,
    unique,
)

# --- devices and volumes -------------------------------------------------------------------


def validate_devices(devices: Devices, at: str) -> None:
    _validate_video_and_watchdog(devices, at)
    ramfb_displays = [
        gpu.name for gpu in devices.gpus
        if (options := gpu.virtual_gpu_options) is not None and options.display is not None
        and options.display.enabled is not False
        and (options.display.ram_fb is None or options.display.ram_fb.enabled is not False)
    ]
    require(len(ramfb_displays) <= 1, f"{at}.gpus",
             f"configuring multiple displays with ramfb is not valid: {ramfb_displays}")
    passed: list[tuple[str, GPU | HostDevice]] = [
        (f"gpus[{i}]", gpu) for i, gpu in enumerate(devices.gpus)]
    passed += [(f"hostDevices[{i}]", host) for i, host in enumerate(devices.host_devices)]
    for where, passthrough in passed:
        _validate_device_source(passthrough, f"{at}.{where}")
    for index, device in enumerate(devices.inputs):
        field = f"{at}.inputs[{index}]"
        require(bool(device.name), f"{field}.name", "must not be empty")
        one_of(device.type, INPUT_TYPES, f"{field}.type")
        if device.bus:
            one_of(device.bus, INPUT_BUSES, f"{field}.bus")
    unique([i.name for i in devices.inputs], f"{at}.inputs[{{}}].name")
    for index, interface in enumerate(devices.interfaces):
        interface_name(interface.name, f"{at}.interfaces[{index}].name")
    unique([i.name for i in devices.interfaces], f"{at}.interfaces[{{}}].name")
    for index, interface in enumerate(devices.interfaces):
        bindings = (interface.masquerade, interface.bridge, interface.sriov)
        require(sum(b is not None for b in bindings) == 1, f"{at}.interfaces[{index}]",
                 "must have exactly one binding method: masquerade, bridge or sriov")
    unique([d.name for d in devices.disks], f"{at}.disks[{{}}].name")
    boot_orders: set[int] = set()
    for index, disk in enumerate(devices.disks):
        field = f"{at}.disks[{index}]"
        require(
            sum(device is not None for device in (disk.disk, disk.cdrom, disk.lun)) <= 1,
            field,
            "must set only one of disk, cdrom or lun (none is a disk)",
        )
        if disk.disk is not None and disk.disk.bus:
            one_of(disk.disk.bus, DISK_BUSES, f"{field}.disk.bus")
        if disk.cdrom is not None and disk.cdrom.bus:
            one_of(disk.cdrom.bus, CDROM_BUSES, f"{field}.cdrom.bus")
        if disk.lun is not None and disk.lun.bus:
            one_of(disk.lun.bus, LUN_BUSES, f"{field}.lun.bus")
        if disk.boot_order is not None:
            require(disk.boot_order > 0, f"{field}.bootOrder", "must be greater than zero")
            require(
                disk.boot_order not in boot_orders,
                f"{field}.bootOrder",
                f"boot order {disk.boot_order} is used by another disk",
            )
            boot_orders.add(disk.boot_order)


def _validate_video_and_watchdog(devices: Devices, at: str) -> None:
    if devices.video is not None:
        require(devices.autoattach_graphics_device is not False, f"{at}.video",
                 "is not allowed when autoattachGraphicsDevice is set to false")
        one_of(devices.video.type, VIDEO_TYPES, f"{at}.video.type")
    watchdog = devices.watchdog
    if watchdog is None:
        return
    require(watchdog.diag288 is None, f"{at}.watchdog",
             "amd64 only supports the i6300esb watchdog device")
    if watchdog.i6300esb is not None and watchdog.i6300esb.action:
        one_of(watchdog.i6300esb.action, WATCHDOG_ACTIONS, f"{at}.watchdog.i6300esb.action")


def validate_io_threads(domain: DomainSpec, at: str) -> None:
    policy = domain.io_threads_policy
    if policy is None:
        return
    one_of(policy, IO_THREADS_POLICIES, f"{at}.ioThreadsPolicy")
    if policy == "supplementalPool":
        count = domain.io_threads.supplemental_pool_thread_count \
            if domain.io_threads is not None else None
        require(count is not None and count >= 1,
                 f"{at}.ioThreads.supplementalPoolThreadCount",
                 "must be set and positive for the supplementalPool policy")


def validate_volumes(devices: Devices, volumes: list[Volume], path: str) -> None:
    for index, volume in enumerate(volumes):
        dns1123_label(volume.name, f"{path}.volumes[{index}].name")
    unique([v.name for v in volumes], f"{path}.volumes[{{}}].name")
    by_name = {v.name: v for v in volumes}
    for index, disk in enumerate(devices.disks):
        field = f"{path}.domain.devices.disks[{index}]"
        dns1123_label(disk.name, f"{field}.name")
        require(
            disk.name in by_name,
            f"{field}.name",
            f"must match the name of a volume in {path}.volumes",
        )
        _validate_disk_volume(disk, by_name[disk.name], field)
    disk_names = {d.name for d in devices.disks}
    for index, volume in enumerate(volumes):
        field = f"{path}.volumes[{index}]"
        require(
            sum(s is not None for s in volume.sources) == 1,
            field,
            "must have exactly one volume source",
        )
        _validate_object_references(volume, field)
        require(
            volume.name in disk_names or volume.downward_metrics is None,
            f"{field}.name",
            f"a DownwardMetrics volume must be used by a disk on the virtio bus in "
            f"{path}.domain.devices.disks (a volume without a disk gets one on {DISK_BUS})",
        )
        if volume.empty_disk is not None:
            parsed(volume.empty_disk.capacity, f"{field}.emptyDisk.capacity")
        if volume.host_disk is not None:
            _validate_host_disk(volume.host_disk, f"{field}.hostDisk")
    service_accounts = sum(v.service_account is not None for v in volumes)
    require(service_accounts <= 1, f"{path}.volumes",
             "must have at most one serviceAccount volume")


def _validate_device_source(device: GPU | HostDevice, field: str) -> None:
    """A device plugin's `deviceName`, or a DRA claim (`claimName` and `requestName`; its
    gate is the cluster's to check), never both."""
    if device.claim_name or device.request_name:
        require(not device.device_name, f"{field}.deviceName",
                 "must not be set together with claimName/requestName")
        require(bool(device.claim_name and device.request_name), field,
                 "a DRA device needs both claimName and requestName")
    else:
        require(bool(device.device_name), f"{field}.deviceName",
                 "is required: the device plugin resource to pass through, or a DRA "
                 "claimName and requestName")


def _validate_host_disk(host_disk: HostDiskSource, field: str) -> None:
    """KubeVirt's hostDisk rules: an absolute path; a capacity exactly for DiskOrCreate."""
    require(host_disk.path.startswith("/"), f"{field}.path", "must be an absolute path")
    if host_disk.type == "DiskOrCreate":
        require(host_disk.capacity is not None, f"{field}.capacity",
                 "is required for type DiskOrCreate")
        if host_disk.capacity is not None:
            parsed(host_disk.capacity, f"{field}.capacity")
    else:
        require(host_disk.capacity is None, f"{field}.capacity",
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
            require(bool(name), f"{field}.{name_field}", "is required")


def validate_networks(networks: list[dict[str, Any]], at: str) -> None:
    for index, network in enumerate(networks):
        interface_name(network.get("name"), f"{at}[{index}].name")
    unique([n["name"] for n in networks], f"{at}[{{}}].name")


def validate_ports(interfaces: list[Interface], networks: list[dict[str, Any]],
                    at: str) -> None:
    """Forwarded ports, checked as KubeVirt checks them: on interfaces of the pod network."""
    pod_networks = {n.get("name") for n in networks if "pod" in n}
    for index, interface in enumerate(interfaces):
        if interface.name not in pod_networks:
            continue
        names: set[str] = set()
        for port_index, port in enumerate(interface.ports):
            field = f"{at}[{index}].ports[{port_index}]"
            require(port.port != 0, f"{field}.port", "is required")
            require(0 < port.port < 65536, f"{field}.port", "must be in range 0 < x < 65536")
            if port.protocol:
                one_of(port.protocol, PORT_PROTOCOLS, f"{field}.protocol")
            if port.name:
                require(port.name not in names, f"{field}.name",
                         f"duplicate name of the port: {port.name!r}")
                require(len(port.name) <= PORT_NAME_MAX and "--" not in port.name
                         and PORT_NAME.fullmatch(port.name) is not None
                         and any(c.isalpha() for c in port.name), f"{field}.name",
                         "must be an IANA service name: at most 15 lower-case letters, digits "
                         "or single '-', with at least one letter")
                names.add(port.name)


def validate_dns(policy: str, config: PodDNSConfig | None, path: str) -> None:
    """Kubernetes' pod DNS rules, which KubeVirt's admission applies to the VMI."""
    if policy:
        one_of(policy, DNS_POLICIES, f"{path}.dnsPolicy")
    if policy == "None":
        require(config is not None, f"{path}.dnsConfig",
                 "must be provided when dnsPolicy is None")
        require(config is not None and bool(config.nameservers),
                 f"{path}.dnsConfig.nameservers",
                 "must list at least one DNS nameserver when dnsPolicy is None")
    if config is None:
        return
    at = f"{path}.dnsConfig"
    require(len(config.nameservers) <= MAX_DNS_NAMESERVERS, f"{at}.nameservers",
             f"must not have more than {MAX_DNS_NAMESERVERS} nameservers")
    for index, nameserver in enumerate(config.nameservers):
        try:
            ipaddress.ip_address(nameserver)
        except ValueError:
            raise InvalidSpec(f"{at}.nameservers[{index}]",
                              f"must be a valid IP address; got {nameserver!r}") from None
    require(len(config.searches) <= MAX_DNS_SEARCH_PATHS, f"{at}.searches",
             f"must not have more than {MAX_DNS_SEARCH_PATHS} search paths")
    require(len(" ".join(config.searches)) <= MAX_DNS_SEARCH_LIST_CHARS, f"{at}.searches",
             f"must not have more than {MAX_DNS_SEARCH_LIST_CHARS} characters "
             "(including spaces) in the search list")
    for index, search in enumerate(config.searches):
        require(len(search) <= DNS1123_SUBDOMAIN_MAX
                 and DNS1123_SUBDOMAIN.fullmatch(search) is not None,
                 f"{at}.searches[{index}]",
                 f"must be a lower-case DNS-1123 subdomain; got {search!r}")
    for index, option in enumerate(config.options):
        require(bool(option.name), f"{at}.options[{index}].name", "must not be empty")


def _validate_disk_volume(disk: Disk, volume: Volume, field: str) -> None:
    """What a disk's device type asks of its volume, as KubeVirt's VMI admission checks it."""
    if disk.lun is not None:
        require(
            volume.persistent_volume_claim is not None or volume.data_volume is not None,
            f"{field}.lun",
            f"can only be mapped to a {LUN_VOLUME_SOURCES} volume",
        )
    if volume.downward_metrics is None:
        return
    require(
        disk.cdrom is None and disk.lun is None,
        f"{field}.disk",
        "DownwardMetrics volume must be used with a disk, not a cdrom or lun",
    )
    bus = disk.disk.bus if disk.disk is not None and disk.disk.bus else DISK_BUS
    require(
        bus == "virtio",
        f"{field}.disk.bus",
        f"DownwardMetrics volume must be on the virtio bus, not {bus!r} "
        f"(a disk without a bus is on {DISK_BUS})",
    )
