"""A VMI spec with an instancetype and a preference applied, as KubeVirt's
`pkg/instancetype/apply` and `pkg/instancetype/preference/apply` do it.

What an instancetype sets, the VM may not set too: each such field is a conflict and the
whole expansion is refused, naming every conflicting field as KubeVirt words it. What a
preference sets only fills what the VM leaves unset. The work is done on the spec's JSON
(absent means unset, as a nil pointer does in KubeVirt) and decoded again at the end, so
the result is checked against the API's schema like anything a user submits.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import msgspec

from events.api.base import ObjectMeta
from events.api.domain import Quantity
from events.api.errors import InvalidSpec
from events.api.instancetype import (
    THREADS_PER_CORE,
    VirtualMachineInstancetypeSpec,
    VirtualMachinePreferenceSpec,
    preferred_topology,
    spread_options,
)
from events.api.resources import quantity
from events.api.unsupported import UNAPPLIED_PREFERENCES_ANNOTATION
from events.api.vm import VirtualMachineInstanceSpec

CONFLICT_RULE: Final = "VM field(s) {} conflicts with selected instance type"
"""KubeVirt's message (`conflict.conflictsErrorFmt`)."""
NOT_CARRIED: Final = {"launchSecurity": "launch_security"}
"""Instancetype fields a VMI of virtbus has no field for yet (JSON name -> attribute): an
instancetype that sets one is refused rather than silently run without it."""
UNAPPLIED_DEVICE_PREFERENCES: Final = (
    "preferredAutoattachInputDevice", "preferredDisableHotplug", "preferredVirtualGPUOptions",
    "preferredUseVirtioTransitional", "preferredDiskIO", "preferredDiskBlockSize",
    "preferredBlockMultiQueue", "preferredNetworkInterfaceMultiQueue",
    "preferredPanicDeviceModel")
"""Device preferences for fields a virtbus VMI has no place for yet: a preference is only a
preference, so they are not refused, but named on the VMI (`UNAPPLIED_PREFERENCES_ANNOTATION`,
stated in its `SpecHonoured` condition) rather than dropped unseen. (`preferredSoundModel`
applies only to a sound device, which virtbus never has; KubeVirt applies
`preferredVirtualGPUOptions` nowhere either.)"""
NOT_CARRIED_CPU: Final = ("realtime",)
CARRIED_DEVICES: Final = ("gpus", "hostDevices")
"""Instancetype device lists the VMI takes whole (KubeVirt's `applyGPUs`,
`applyHostDevices`): a VM that lists its own conflicts."""
CARRIED_DOMAIN: Final = ("ioThreadsPolicy", "ioThreads")
"""Instancetype fields that become the domain's own (`applyIOThreadPolicy`, ...)."""
INTERFACE_BINDINGS: Final = ("masquerade", "bridge")
"""An interface's binding methods: with none set, a preferred masquerade applies."""
PERCENT: Final = 100
BINARY_SUFFIXES: Final = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
DECIMAL_SUFFIXES: Final = ("k", "M", "G", "T", "P", "E")


def _float32(x: float) -> float:
    """`x` rounded to a Go float32, which KubeVirt's overcommit arithmetic uses."""
    rounded: float = struct.unpack("f", struct.pack("f", x))[0]
    return rounded


def _quantity_like(amount: int, like: Quantity) -> str:
    """`amount` as Kubernetes writes a quantity in the format of `like` (binary `Mi`/`Gi`
    or decimal `M`/`G`): with the largest suffix that divides it exactly."""
    binary = isinstance(like, str) and like.endswith("i")
    base, suffixes = (1024, BINARY_SUFFIXES) if binary else (1000, DECIMAL_SUFFIXES)
    shown, exponent = amount, 0
    while shown and shown % base == 0 and exponent < len(suffixes):
        shown, exponent = shown // base, exponent + 1
    return f"{shown}{suffixes[exponent - 1]}" if exponent else str(shown)


class InstancetypeConflict(InvalidSpec):
    """Fields the VM sets that its instancetype fixes; named by the first, listed in the rule."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        super().__init__(paths[0], CONFLICT_RULE.format(", ".join(paths)))


class Expanded(msgspec.Struct, frozen=True):
    spec: VirtualMachineInstanceSpec
    annotations: dict[str, str]


def expand(spec: VirtualMachineInstanceSpec, meta: ObjectMeta,
           instancetype: VirtualMachineInstancetypeSpec | None,
           preference: VirtualMachinePreferenceSpec | None, path: str) -> Expanded:
    """`spec` (and its metadata's annotations) with both applied; `path` is where the spec
    sits in what the user wrote (`spec.template.spec`), for the conflicts' names."""
    vmi: dict[str, Any] = msgspec.to_builtins(spec)
    annotations = dict(meta.annotations)
    if instancetype is not None:
        conflicts = _apply_instancetype(instancetype, preference, vmi, annotations, path)
        if conflicts:
            raise InstancetypeConflict(conflicts)
    if preference is not None:
        _apply_preference(preference, vmi, annotations)
        if unapplied := unapplied_preferences(preference):
            annotations[UNAPPLIED_PREFERENCES_ANNOTATION] = ",".join(unapplied)
    try:
        expanded = msgspec.convert(vmi, VirtualMachineInstanceSpec)
    except msgspec.ValidationError as e:
        raise InvalidSpec(path, f"the instancetype and preference expand to an invalid spec: "
                                f"{e}") from None
    return Expanded(expanded, annotations)


def not_carried(instancetype: VirtualMachineInstancetypeSpec) -> list[str]:
    """The instancetype's fields a virtbus VMI cannot hold yet."""
    fields = [name for name, attr in NOT_CARRIED.items() if getattr(instancetype, attr)]
    cpu = msgspec.to_builtins(instancetype.cpu)
    fields += [f"cpu.{name}" for name in NOT_CARRIED_CPU if name in cpu]
    return fields


def unapplied_preferences(preference: VirtualMachinePreferenceSpec) -> list[str]:
    """What the preference asks that no virtbus VMI can hold (JSON paths in the preference)."""
    devices = msgspec.to_builtins(preference.devices) if preference.devices else {}
    unapplied = [f"devices.{name}" for name in UNAPPLIED_DEVICE_PREFERENCES if name in devices]
    if preference.preferred_launch_security is not None:
        unapplied.append("preferredLaunchSecurity")
    return unapplied


# --- instancetype ----------------------------------------------------------------------------


def _apply_instancetype(it: VirtualMachineInstancetypeSpec,
                        pref: VirtualMachinePreferenceSpec | None, vmi: dict[str, Any],
                        annotations: dict[str, str], path: str) -> list[str]:
    conflicts: list[str] = []
    if it.node_selector:
        if vmi.get("nodeSelector"):
            conflicts.append(f"{path}.nodeSelector")
        else:
            vmi["nodeSelector"] = dict(it.node_selector)
    if it.scheduler_name:
        if vmi.get("schedulerName"):
            conflicts.append(f"{path}.schedulerName")
        else:
            vmi["schedulerName"] = it.scheduler_name
    conflicts += _apply_cpu(it, pref, vmi, path)
    conflicts += _apply_memory(it, vmi, path)
    conflicts += _apply_domain_fields(it, vmi, path)
    for key, value in it.annotations.items():
        if key not in annotations:
            annotations[key] = value
        elif annotations[key] != value:
            conflicts.append(f"annotations.{key}")
    return conflicts


def _apply_cpu(it: VirtualMachineInstancetypeSpec, pref: VirtualMachinePreferenceSpec | None,
               vmi: dict[str, Any], path: str) -> list[str]:
    domain = vmi.setdefault("domain", {})
    cpu = domain.setdefault("cpu", {})
    resources = domain.get("resources", {})
    at = f"{path}.domain"
    conflicts = [f"{at}.resources.{kind}.cpu" for kind in ("requests", "limits")
                 if "cpu" in resources.get(kind, {})]
    conflicts += [f"{at}.cpu.{name}" for name in ("sockets", "cores", "threads") if cpu.get(name)]
    wanted = msgspec.to_builtins(it.cpu)
    conflicts += [f"{at}.cpu.{name}" for name in ("model", "dedicatedCPUPlacement",
                                                 "isolateEmulatorThread", "numa")
                  if cpu.get(_domain_cpu_key(name)) and name in wanted]
    if conflicts:
        return conflicts
    for name in ("model", "dedicatedCPUPlacement", "isolateEmulatorThread", "maxSockets",
                 "numa"):
        if name in wanted:
            cpu[_domain_cpu_key(name)] = wanted[name]
    cpu.update(_topology(it.cpu.guest, pref))
    return []


def _domain_cpu_key(name: str) -> str:
    """The JSON name of a CPU field in virtbus's domain (which spells `CPU` camelCase)."""
    return "dedicatedCpuPlacement" if name == "dedicatedCPUPlacement" else name


def _topology(vcpus: int, pref: VirtualMachinePreferenceSpec | None) -> dict[str, int]:
    """KubeVirt's `applyGuestCPUTopology`: all the vCPUs on the preferred axis (sockets for
    `any` too), or spread by a ratio."""
    out = {"cores": 1, "sockets": 1, "threads": 1}
    if vcpus == 1:
        return out
    match preferred_topology(pref):
        case "cores":
            out["cores"] = vcpus
        case "threads":
            out["threads"] = vcpus
        case "spread":
            ratio, across = spread_options(pref)
            match across:
                case "SocketsCores":
                    out["cores"], out["sockets"] = ratio, vcpus // ratio
                case "CoresThreads":
                    out["threads"], out["cores"] = ratio, vcpus // ratio
                case _:
                    out["threads"], out["cores"] = THREADS_PER_CORE, ratio
                    out["sockets"] = vcpus // THREADS_PER_CORE // ratio
        case _:  # sockets, any
            out["sockets"] = vcpus
    return out


def _apply_memory(it: VirtualMachineInstancetypeSpec, vmi: dict[str, Any],
                  path: str) -> list[str]:
    domain = vmi["domain"]
    memory = domain.setdefault("memory", {})
    resources = domain.get("resources", {})
    at = f"{path}.domain"
    if "guest" in memory:
        return [f"{at}.memory.guest"]
    if "hugepages" in memory and it.memory.hugepages is not None:
        return [f"{at}.memory.hugepages"]
    for kind in ("requests", "limits"):
        if "memory" in resources.get(kind, {}):
            return [f"{at}.resources.{kind}.memory"]
    memory["guest"] = it.memory.guest
    if it.memory.overcommit_percent > 0:
        guest = _float32(float(quantity(it.memory.guest)))
        share = _float32(1 - _float32(it.memory.overcommit_percent / PERCENT))
        requests = domain.setdefault("resources", {}).setdefault("requests", {})
        requests["memory"] = _quantity_like(int(_float32(guest * share)), it.memory.guest)
    if it.memory.hugepages is not None:
        memory["hugepages"] = msgspec.to_builtins(it.memory.hugepages)
    max_guest = msgspec.to_builtins(it.memory).get("maxGuest")
    if max_guest is not None:
        memory["maxGuest"] = max_guest
    return []


def _apply_domain_fields(it: VirtualMachineInstancetypeSpec, vmi: dict[str, Any],
                         path: str) -> list[str]:
    """GPUs, host devices and IO threads: the instancetype's, where the VM sets none."""
    wanted = msgspec.to_builtins(it)
    domain = vmi["domain"]
    devices = domain.setdefault("devices", {})
    at = f"{path}.domain"
    conflicts = [f"{at}.devices.{name}" for name in CARRIED_DEVICES
                 if wanted.get(name) and devices.get(name)]
    conflicts += [f"{at}.{name}" for name in CARRIED_DOMAIN
                  if wanted.get(name) is not None and domain.get(name) is not None]
    if conflicts:
        return conflicts
    for name in CARRIED_DEVICES:
        if wanted.get(name):
            devices[name] = wanted[name]
    for name in CARRIED_DOMAIN:
        if wanted.get(name) is not None:
            domain[name] = wanted[name]
    return []


# --- preference ------------------------------------------------------------------------------


def _unset(target: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` to the preferred `value` (JSON) only where the VM left it unset."""
    if value is not None and key not in target:
        target[key] = msgspec.to_builtins(value)


def _apply_preference(pref: VirtualMachinePreferenceSpec, vmi: dict[str, Any],
                      annotations: dict[str, str]) -> None:
    domain = vmi.setdefault("domain", {})
    if pref.cpu is not None and pref.cpu.preferred_cpu_features:
        cpu = domain.setdefault("cpu", {})
        features = list(cpu.get("features", []))
        named = {f["name"] for f in features}
        features += [msgspec.to_builtins(f) for f in pref.cpu.preferred_cpu_features
                     if f.name not in named]
        cpu["features"] = features
    pod_networks = {n.get("name") for n in vmi.get("networks", []) if "pod" in n}
    _apply_devices(pref, domain, {name for name in pod_networks if isinstance(name, str)})
    _apply_features(pref, domain)
    _apply_firmware(pref, domain)
    if pref.machine is not None and pref.machine.preferred_machine_type:
        machine = domain.setdefault("machine", {})
        if not machine.get("type"):
            machine["type"] = pref.machine.preferred_machine_type
    if pref.clock is not None:
        clock = domain.setdefault("clock", {})
        offset = pref.clock.preferred_clock_offset
        if offset is not None and "utc" not in clock and "timezone" not in clock:
            clock.update(msgspec.to_builtins(offset))
        _unset(clock, "timer", pref.clock.preferred_timer)
    if pref.preferred_subdomain is not None and not vmi.get("subdomain"):
        vmi["subdomain"] = pref.preferred_subdomain
    _unset(vmi, "terminationGracePeriodSeconds", pref.preferred_termination_grace_period_seconds)
    if pref.preferred_architecture and not vmi.get("architecture"):
        vmi["architecture"] = pref.preferred_architecture
    for key, value in pref.annotations.items():
        annotations.setdefault(key, value)


def _apply_devices(pref: VirtualMachinePreferenceSpec, domain: dict[str, Any],
                   pod_networks: set[str]) -> None:
    dev = pref.devices
    if dev is None:
        return
    devices = domain.setdefault("devices", {})
    for key, value in (("autoattachGraphicsDevice", dev.preferred_autoattach_graphics_device),
                       ("autoattachMemBalloon", dev.preferred_autoattach_mem_balloon),
                       ("autoattachPodInterface", dev.preferred_autoattach_pod_interface),
                       ("autoattachSerialConsole", dev.preferred_autoattach_serial_console),
                       ("rng", dev.preferred_rng), ("tpm", dev.preferred_tpm)):
        _unset(devices, key, value)
    if dev.preferred_video_type is not None:
        video = devices.setdefault("video", {})
        if not video.get("type"):
            video["type"] = dev.preferred_video_type
    for disk in devices.get("disks", []):
        if not any(target in disk for target in ("disk", "cdrom", "lun")):
            disk["disk"] = {}
        if "disk" in disk:
            if dev.preferred_disk_bus and not disk["disk"].get("bus"):
                disk["disk"]["bus"] = dev.preferred_disk_bus
            if dev.preferred_disk_cache and not disk.get("cache"):
                disk["cache"] = dev.preferred_disk_cache
            if disk["disk"].get("bus") == "virtio":  # as KubeVirt: after the preferred bus
                _unset(disk, "dedicatedIOThread", dev.preferred_disk_dedicated_io_thread)
        elif "cdrom" in disk:
            if dev.preferred_cdrom_bus and not disk["cdrom"].get("bus"):
                disk["cdrom"]["bus"] = dev.preferred_cdrom_bus
        elif dev.preferred_lun_bus and not disk["lun"].get("bus"):
            disk["lun"]["bus"] = dev.preferred_lun_bus
    for iface in devices.get("interfaces", []):
        if dev.preferred_interface_model and not iface.get("model"):
            iface["model"] = dev.preferred_interface_model
        if dev.preferred_interface_masquerade is not None and iface["name"] in pod_networks \
                and not any(binding in iface for binding in INTERFACE_BINDINGS):
            iface["masquerade"] = {}
    for device in devices.get("inputs", []):
        if dev.preferred_input_bus and not device.get("bus"):
            device["bus"] = dev.preferred_input_bus
        if dev.preferred_input_type and not device.get("type"):
            device["type"] = dev.preferred_input_type


def _apply_features(pref: VirtualMachinePreferenceSpec, domain: dict[str, Any]) -> None:
    feat = pref.features
    if feat is None:
        return
    features = domain.setdefault("features", {})
    if feat.preferred_acpi is not None:  # KubeVirt overwrites: ACPI is no pointer there
        features["acpi"] = msgspec.to_builtins(feat.preferred_acpi)
    for key, value in (("apic", feat.preferred_apic), ("kvm", feat.preferred_kvm),
                       ("pvspinlock", feat.preferred_pvspinlock), ("smm", feat.preferred_smm)):
        _unset(features, key, value)
    if feat.preferred_hyperv is not None:
        hyperv = features.setdefault("hyperv", {})
        for key, value in msgspec.to_builtins(feat.preferred_hyperv).items():
            hyperv.setdefault(key, value)


def _apply_firmware(pref: VirtualMachinePreferenceSpec, domain: dict[str, Any]) -> None:
    fw = pref.firmware
    if fw is None:
        return
    boot = domain.setdefault("firmware", {}).setdefault("bootloader", {})
    if fw.preferred_use_bios and "bios" not in boot and "efi" not in boot:
        boot["bios"] = {}
    if fw.preferred_use_bios_serial is not None and "bios" in boot:
        boot["bios"].setdefault("useSerial", fw.preferred_use_bios_serial)
    if "efi" not in boot and "bios" not in boot and fw.preferred_efi is not None:
        boot["efi"] = msgspec.to_builtins(fw.preferred_efi)
        return  # the deprecated spellings below give way to preferredEfi
    if fw.preferred_use_efi and "efi" not in boot and "bios" not in boot:
        boot["efi"] = {}
    if fw.preferred_use_secure_boot is not None and "efi" in boot:
        boot["efi"].setdefault("secureBoot", fw.preferred_use_secure_boot)
