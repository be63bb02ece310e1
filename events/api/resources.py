"""What a VMI asks of a node, derived from its spec alone.

The scheduler (placing a VMI) and the node agent (sizing the domain) must agree on
these numbers, so both import them from here.

Memory overhead follows KubeVirt's `GetMemoryOverhead` (amd64):

    overhead = guest / 512                     page tables, one bit per 512 B of RAM
             + 25Mi + 100Mi + 25Mi + 40Mi + 30Mi
                                               virt-launcher-monitor, virt-launcher,
                                               virtlogd, virtqemud, qemu itself
             + 8Mi * vCPUs                     per-vCPU tables
             + 8Mi                             the IO thread
             + 32Mi   unless autoattachGraphicsDevice is false   (video RAM)

The scheduling memory request is guest memory plus that overhead, except that
`overcommitGuestOverhead: true` leaves the overhead out and hugepages-backed guest
memory is asked for as a `hugepages-<size>` resource instead of plain memory.

Each GPU and host device asks for one of its `deviceName`, the device plugin's resource,
as KubeVirt's launcher pod does: a VMI wanting a device no node offers stays Pending,
Unschedulable, with kube-scheduler's "Insufficient <deviceName>".
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, NamedTuple

import msgspec

if TYPE_CHECKING:
    from collections.abc import Callable
    from decimal import Decimal

    from events.api.domain import DomainSpec, Quantity

KVM_DEVICE = "devices.kubevirt.io/kvm"
"""Extended resource for /dev/kvm, advertised by every node agent."""
TUN_DEVICE = "devices.kubevirt.io/tun"
"""Extended resource for /dev/net/tun, needed by VMIs with a network interface."""
HUGEPAGES_PREFIX = "hugepages-"
"""Kubernetes' resource name prefix for pre-allocated hugepages (`hugepages-2Mi`)."""

MiB = 1024 * 1024
PAGETABLE_DIVISOR = 512
FIXED_OVERHEAD_BYTES = (25 + 100 + 25 + 40 + 30) * MiB
PER_VCPU_OVERHEAD_BYTES = 8 * MiB
IOTHREAD_OVERHEAD_BYTES = 8 * MiB
VIDEO_OVERHEAD_BYTES = 32 * MiB
CPU_ALLOCATION_RATIO = 10
"""KubeVirt's default `cpuAllocationRatio`: without a CPU request a vCPU asks for 1/10 core."""
MEMORY_OVERCOMMIT_PERCENT = 100
"""KubeVirt's default `memoryOvercommit`: a VMI asks for all of its guest memory."""


class ClusterTuning(msgspec.Struct, frozen=True, kw_only=True):
    """The cluster-wide knobs of the effective KubeVirt configuration that change a VMI's ask
    (`developerConfiguration.cpuAllocationRatio` / `.memoryOvercommit`, set by the
    HyperConverged's `vmiCPUAllocationRatio` / `higherWorkloadDensity`)."""

    cpu_allocation_ratio: int = CPU_ALLOCATION_RATIO
    memory_overcommit_percent: int = MEMORY_OVERCOMMIT_PERCENT


DEFAULT_TUNING = ClusterTuning()


@functools.cache
def _quantity_parser() -> Callable[[Quantity], Decimal]:
    """kubernetes' parser, imported on first use: importing the kubernetes package takes a
    quarter of a second, which a CLI call that parses no quantity should not pay."""
    from kubernetes.utils import parse_quantity  # noqa: PLC0415

    parse: Callable[[Quantity], Decimal] = parse_quantity
    return parse


def load_quantity_parser() -> None:
    """For a long-running process, at its start: the first quantity parsed otherwise imports
    kubernetes there, half a second of CPU on the event loop (seconds on a busy machine) in
    the middle of a standby's takeover or an agent's first launch, its heartbeat held up."""
    _quantity_parser()


def quantity(value: Quantity) -> Decimal:
    """A Kubernetes quantity as a number; raises ValueError when it is not one."""
    return _quantity_parser()(value)


class CPUTopology(NamedTuple):
    sockets: int
    cores: int
    threads: int

    @property
    def vcpus(self) -> int:
        return self.sockets * self.cores * self.threads


def cpu_topology(domain: DomainSpec) -> CPUTopology:
    """Guest topology; without one, the CPU limit (else request) becomes sockets, like KubeVirt."""
    cpu = domain.cpu
    if cpu is not None and (cpu.sockets or cpu.cores or cpu.threads):
        return CPUTopology(cpu.sockets or 1, cpu.cores or 1, cpu.threads or 1)
    resources = domain.resources
    from_resources = resources.limits.get("cpu", resources.requests.get("cpu"))
    sockets = math.ceil(quantity(from_resources)) if from_resources is not None else 1
    return CPUTopology(max(sockets, 1), 1, 1)


def _memory_quantity(domain: DomainSpec) -> Quantity | None:
    if domain.memory is not None and domain.memory.guest is not None:
        return domain.memory.guest
    resources = domain.resources
    return resources.requests.get("memory", resources.limits.get("memory"))


def guest_memory_bytes(domain: DomainSpec) -> int:
    """Memory the guest sees: `memory.guest`, else the memory request, else the limit."""
    value = _memory_quantity(domain)
    return int(quantity(value)) if value is not None else 0


def memory_overhead_bytes(domain: DomainSpec) -> int:
    """Host memory a VMI uses beyond its guest RAM (formula in the module docstring)."""
    overhead = guest_memory_bytes(domain) // PAGETABLE_DIVISOR
    overhead += FIXED_OVERHEAD_BYTES + IOTHREAD_OVERHEAD_BYTES
    overhead += PER_VCPU_OVERHEAD_BYTES * cpu_topology(domain).vcpus
    if domain.devices.autoattach_graphics_device is not False:
        overhead += VIDEO_OVERHEAD_BYTES
    return overhead


def hugepage_size(domain: DomainSpec) -> str:
    """`memory.hugepages.pageSize`, or "" when guest memory is ordinary pages."""
    if domain.memory is None or domain.memory.hugepages is None:
        return ""
    return domain.memory.hugepages.page_size


def needs_tun(domain: DomainSpec) -> bool:
    """KubeVirt's NeedTunDevice: any interface, or the pod interface attached by default."""
    devices = domain.devices
    return bool(devices.interfaces) or devices.autoattach_pod_interface is not False


def cpu_request_millis(domain: DomainSpec, tuning: ClusterTuning = DEFAULT_TUNING) -> int:
    """CPU the scheduler reserves: the request, else the limit, else vCPUs over the ratio."""
    resources = domain.resources
    if domain.cpu is not None and domain.cpu.dedicated_cpu_placement:
        return cpu_topology(domain).vcpus * 1000
    explicit = resources.requests.get("cpu", resources.limits.get("cpu"))
    if explicit is not None:
        return math.ceil(quantity(explicit) * 1000)
    return math.ceil(cpu_topology(domain).vcpus * 1000 / tuning.cpu_allocation_ratio)


class VMIResources(msgspec.Struct, frozen=True, kw_only=True):
    """A VMI's ask of a node: CPU, memory, and extended resources (devices, hugepages)."""

    cpu_millis: int
    memory_bytes: int
    extended: dict[str, int]


def requested_memory_bytes(domain: DomainSpec, tuning: ClusterTuning = DEFAULT_TUNING) -> int:
    """Guest memory as the scheduler counts it: a VMI that sets `memory.guest` but no memory
    request asks for guest * 100 / memoryOvercommit, as KubeVirt's defaulting does."""
    guest = guest_memory_bytes(domain)
    explicit = "memory" in domain.resources.requests
    if domain.memory is not None and domain.memory.guest and not explicit:
        return guest * 100 // tuning.memory_overcommit_percent
    return guest


def vmi_resources(domain: DomainSpec, *, emulation: bool = False,
                  tuning: ClusterTuning = DEFAULT_TUNING) -> VMIResources:
    """Everything a node must have free for this VMI; `emulation` drops the /dev/kvm need."""
    guest = requested_memory_bytes(domain, tuning)
    overhead = 0 if domain.resources.overcommit_guest_overhead else memory_overhead_bytes(domain)
    extended: dict[str, int] = {}
    if not emulation:
        extended[KVM_DEVICE] = 1
    if needs_tun(domain):
        extended[TUN_DEVICE] = 1
    devices = domain.devices
    for name in [g.device_name for g in devices.gpus] + [h.device_name for h in
                                                         devices.host_devices]:
        if name:
            extended[name] = extended.get(name, 0) + 1
    memory = guest + overhead
    page_size = hugepage_size(domain)
    if page_size:
        extended[HUGEPAGES_PREFIX + page_size] = guest
        memory = overhead
    return VMIResources(
        cpu_millis=cpu_request_millis(domain, tuning), memory_bytes=memory, extended=extended
    )
