"""Admission rules for a VMI spec: what KubeVirt's validating webhook refuses, refused here.

Every rule raises `InvalidSpec(field, rule)` with the JSON path of the offending field,
so a person can find it in the manifest they wrote. Checks stop at the first broken rule.
"""

from __future__ import annotations

import fnmatch
import posixpath
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from events.api.device_validation import (
    validate_devices,
    validate_dns,
    validate_io_threads,
    validate_networks,
    validate_ports,
    validate_volumes,
)
from events.api.errors import InvalidSpec
from events.api.resources import cpu_topology, quantity

if TYPE_CHECKING:
    from decimal import Decimal

    from events.api.domain import (
        CPU,
        Clock,
        DomainSpec,
        FeatureHyperv,
        Features,
        Firmware,
        KernelBoot,
        Volume,
    )
    from events.api.vm import PodDNSConfig

from events.api.spec_rules import (
    CPU_FEATURE_POLICIES,
    EMULATED_MACHINES,
    HUGEPAGE_SIZES,
    HYPERV_REQUIRES,
    MAX_VENDORID_LENGTH,
    MIN_SPINLOCK_RETRIES,
    RTC_TRACKS,
    START_PAUSED,
    TICK_POLICIES,
    one_of,
    parsed,
    require,
    unique,
)


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
    require(
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
        require(domain.features.hyperv_passthrough is None, f"{at}.features.hypervPassthrough",
                 f"cannot be set together with {at}.features.hyperv: use one or the other")
    validate_devices(domain.devices, f"{at}.devices")
    validate_io_threads(domain, at)
    validate_volumes(domain.devices, spec.volumes, path)
    validate_networks(spec.networks, f"{path}.networks")
    validate_ports(domain.devices.interfaces, spec.networks, f"{at}.devices.interfaces")
    validate_dns(spec.dns_policy, spec.dns_config, path)


def _validate_start_strategy(spec: VMISpecLike, path: str) -> None:
    field = f"{path}.startStrategy"
    if spec.start_strategy:
        one_of(spec.start_strategy, (START_PAUSED,), field)
        require(
            spec.liveness_probe is None,
            field,
            f"a paused start cannot be combined with {path}.livenessProbe",
        )


def _validate_machine_type(machine_type: str, field: str) -> None:
    require(
        any(fnmatch.fnmatchcase(machine_type, pattern) for pattern in EMULATED_MACHINES),
        field,
        f"must match one of the emulated machines {', '.join(EMULATED_MACHINES)}; "
        f"got {machine_type!r}",
    )


def _validate_max_sockets(domain: DomainSpec, at: str) -> None:
    """Hot-plug adds sockets up to maxSockets: the sockets the VMI starts with must fit."""
    max_sockets = domain.cpu.max_sockets if domain.cpu is not None else 0
    sockets = cpu_topology(domain).sockets
    require(
        not max_sockets or sockets <= max_sockets,
        f"{at}.sockets",
        f"must not be greater than {at}.maxSockets ({sockets} > {max_sockets})",
    )


# --- resources and memory ----------------------------------------------------------------


def _validate_resources(domain: DomainSpec, at: str) -> None:
    resources, at = domain.resources, f"{at}.resources"
    limits = {k: parsed(v, f"{at}.limits.{k}") for k, v in resources.limits.items()}
    for key, value in resources.requests.items():
        request = parsed(value, f"{at}.requests.{key}")
        if key in limits:
            require(
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
    size = parsed(requested, f"{at}.memory.guest")
    require(size > 0, f"{at}.memory.guest", "guest memory must be greater than zero")
    limit = resources.limits.get("memory")
    if guest is not None and limit is not None:
        require(
            size <= quantity(limit),
            f"{at}.memory.guest",
            f"must be less than or equal to {at}.resources.limits.memory",
        )
    if memory is not None and memory.hugepages is not None:
        _validate_hugepages(memory.hugepages.page_size, size, f"{at}.memory.hugepages.pageSize")
    if memory is not None and memory.max_guest is not None:
        require(
            parsed(memory.max_guest, f"{at}.memory.maxGuest") >= size,
            f"{at}.memory.maxGuest",
            f"must be greater than or equal to {at}.memory.guest",
        )


def _validate_hugepages(page_size: str, memory: Decimal, field: str) -> None:
    """The seed's three hugepages limitations."""
    page = parsed(page_size, field)
    require(
        page_size in HUGEPAGE_SIZES,
        field,
        f"must be a hugepage size nodes pre-allocate ({', '.join(HUGEPAGE_SIZES)})",
    )
    require(page <= memory, field, "hugepages size cannot be bigger than requested memory")
    require(memory % page == 0, field, "requested memory must be divisible by hugepages size")


# --- cpu, firmware, clock, features --------------------------------------------------------


def _validate_cpu(cpu: CPU, at: str) -> None:
    counts = {
        "cores": cpu.cores,
        "sockets": cpu.sockets,
        "threads": cpu.threads,
        "maxSockets": cpu.max_sockets,
    }
    for name, count in counts.items():
        require(count >= 0, f"{at}.{name}", "must not be negative")
    for index, feature in enumerate(cpu.features):
        require(bool(feature.name), f"{at}.features[{index}].name", "must not be empty")
        if feature.policy:
            one_of(feature.policy, CPU_FEATURE_POLICIES, f"{at}.features[{index}].policy")
    unique([f.name for f in cpu.features], f"{at}.features[{{}}].name")
    require(
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
    require(cpu.dedicated_cpu_placement, field,
             f"requires {at}.cpu.dedicatedCpuPlacement to be true")
    require(domain.memory is not None and domain.memory.hugepages is not None, field,
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
    require(
        loader.bios is None or loader.efi is None,
        f"{at}.bootloader",
        "must set either bios or efi, not both",
    )
    if loader.efi is not None and loader.efi.secure_boot:
        require(
            _smm_enabled(features),
            f"{at}.bootloader.efi.secureBoot",
            "SecureBoot requires SMM: enable spec.domain.features.smm",
        )


def _validate_kernel_boot(kernel_boot: KernelBoot, at: str) -> None:
    container = kernel_boot.container
    if container is None:
        require(not kernel_boot.kernel_args, f"{at}.kernelArgs",
                 "kernel arguments cannot be provided without an external kernel")
        return
    require(bool(container.image), f"{at}.container.image", "must be set")
    require(bool(container.kernel_path or container.initrd_path), f"{at}.container",
             "must set at least one of kernelPath, initrdPath")
    for name, path in (("kernelPath", container.kernel_path),
                       ("initrdPath", container.initrd_path)):
        if path:
            _absolute_file_path(path, f"{at}.container.{name}")


def _absolute_file_path(path: str, field: str) -> None:
    """KubeVirt's ValidatePath: absolute, not the root, no `.`/`..` or doubled slashes."""
    require(path != "/", field, "must not point to root")
    require(posixpath.normpath("///" + path) == path.rstrip("/"), field,
             "must be an absolute path to a file without relative components")


def _validate_clock(clock: Clock, at: str) -> None:
    require(
        clock.utc is None or clock.timezone is None,
        at,
        "must set either utc or timezone, not both",
    )
    timer = clock.timer
    if timer is None:
        return
    for name, ticking in (("hpet", timer.hpet), ("pit", timer.pit), ("rtc", timer.rtc)):
        if ticking is not None and ticking.tick_policy:
            one_of(ticking.tick_policy, TICK_POLICIES[name], f"{at}.timer.{name}.tickPolicy")
    if timer.rtc is not None and timer.rtc.track:
        one_of(timer.rtc.track, RTC_TRACKS, f"{at}.timer.rtc.track")


def _validate_hyperv(hyperv: FeatureHyperv, at: str) -> None:
    spinlocks = hyperv.spinlocks
    if spinlocks is not None and spinlocks.spinlocks is not None:
        require(
            spinlocks.spinlocks >= MIN_SPINLOCK_RETRIES,
            f"{at}.spinlocks.spinlocks",
            f"must be at least {MIN_SPINLOCK_RETRIES}",
        )
    if hyperv.vendorid is not None:
        require(
            len(hyperv.vendorid.vendorid) <= MAX_VENDORID_LENGTH,
            f"{at}.vendorid.vendorid",
            f"must be at most {MAX_VENDORID_LENGTH} characters",
        )
    for feature, required in HYPERV_REQUIRES.items():
        wanted = getattr(hyperv, feature)
        needed = getattr(hyperv, required)
        require(
            wanted is None
            or wanted.enabled is False
            or needed is None
            or needed.enabled is not False,
            f"{at}.{feature}",
            f"requires {at}.{required}, which is disabled",
        )


