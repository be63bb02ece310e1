"""`<iothreads>` and each virtio disk's `<driver iothread=…>`: disk I/O off the vCPU threads.

Counted and assigned as KubeVirt's iothreads package and disk configurator do, when
`ioThreadsPolicy` is set or a disk asks for `dedicatedIOThread`:

| policy             | threads                                                       |
|--------------------|---------------------------------------------------------------|
| unset, `shared`    | a pool of 1                                                   |
| `auto`             | a pool of 2 per CPU requested (else limited), 1 if emulator isolated |
| `supplementalPool` | `ioThreads.supplementalPoolThreadCount`, every virtio disk on all |

Dedicated disks get threads after the pool, one each, in disk order; the others share the
pool round robin from thread 1. When disks outnumber the pool limit the pool shrinks to
what the dedicated ones leave (at least 1). Only virtio disks take a thread; a scsi disk
asking for a dedicated one puts the scsi controller on the pool thread after the last
shared virtio disk's, with one queue per vCPU (KubeVirt's assignSCSIControllerIOThread).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from events.api.resources import cpu_topology, quantity
from nodeagent.converter.disks import disk_bus
from nodeagent.converter.xmltree import sub

if TYPE_CHECKING:
    from events.api.domain import DomainSpec
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element

THREADS_PER_CPU = 2
SUPPLEMENTAL_POOL = "supplementalPool"


class ThreadPlan(NamedTuple):
    total: int
    shared: int
    """Threads 1..shared are shared round robin; dedicated ones follow."""


def thread_plan(domain: DomainSpec) -> ThreadPlan | None:
    """How many I/O threads, and how many of them shared; None when the spec asks for none."""
    disks = domain.devices.disks
    policy = domain.io_threads_policy
    if policy is None and not any(d.dedicated_io_thread for d in disks):
        return None
    if policy == SUPPLEMENTAL_POOL:
        count = domain.io_threads.supplemental_pool_thread_count if domain.io_threads else None
        return ThreadPlan(count or 0, 0)
    dedicated = sum(bool(d.dedicated_io_thread) for d in disks)
    shared = len(disks) - dedicated
    limit = _pool_limit(domain)
    if shared + dedicated > limit:
        shared = max(limit - dedicated, 1)
    return ThreadPlan(shared + dedicated, shared)


def _pool_limit(domain: DomainSpec) -> int:
    if domain.io_threads_policy != "auto":
        return 1
    cpu = domain.cpu
    if cpu is not None and cpu.dedicated_cpu_placement and cpu.isolate_emulator_thread:
        return 1
    resources = domain.resources
    cpus = resources.requests.get("cpu", resources.limits.get("cpu"))
    return THREADS_PER_CPU * (math.ceil(quantity(cpus)) if cpus is not None else 1)


def configure_iothreads(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    plan = thread_plan(spec.domain)
    if plan is None:
        return
    sub(domain, "iothreads", plan.total)
    drivers = {alias.get("name", ""): driver for disk in domain.iterfind("devices/disk")
               if (alias := disk.find("alias")) is not None
               and (driver := disk.find("driver")) is not None}
    pool = spec.domain.io_threads_policy == SUPPLEMENTAL_POOL
    next_shared, next_dedicated = 1, plan.shared + 1
    for disk in spec.domain.devices.disks:
        driver = drivers.get(f"ua-{disk.name}")
        if driver is None or disk_bus(disk) != "virtio":
            continue
        if pool:
            threads = sub(driver, "iothreads")
            for thread in range(1, plan.total + 1):
                sub(threads, "iothread", id=thread)
        elif disk.dedicated_io_thread:
            driver.set("iothread", str(next_dedicated))
            next_dedicated += 1
        else:
            driver.set("iothread", str(next_shared))
            next_shared = next_shared % plan.shared + 1
    _place_scsi_controller(spec.domain, plan, domain)


def _place_scsi_controller(spec_domain: DomainSpec, plan: ThreadPlan, domain: Element) -> None:
    disks = spec_domain.devices.disks
    controller = domain.find("devices/controller[@type='scsi']")
    wanted = any(disk_bus(d) == "scsi" and d.dedicated_io_thread for d in disks)
    if controller is None or not wanted or plan.shared == 0:
        return
    thread = 1
    for disk in disks:
        if disk_bus(disk) == "virtio" and not disk.dedicated_io_thread:
            thread = thread % plan.shared + 1
    sub(controller, "driver", iothread=thread, queues=cpu_topology(spec_domain).vcpus)
