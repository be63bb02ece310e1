"""A live migration on a real hypervisor: libvirt's `migrateToURI3`, watched and cut short
as KubeVirt's virt-launcher does it (`pkg/virt-launcher/virtwrap/live-migration-source.go`).

- Flags: live, peer-to-peer (the source's libvirtd drives the migration and talks to the
  target's itself), persist on the destination; plus auto-converge and post-copy when the
  migration allows them, and non-shared-incremental (block migration) when the guest has
  local disks to copy: every file-backed disk that is neither read-only nor shareable, which
  on a virtbus node is a containerDisk's overlay or an emptyDisk (the target made its own
  copies of the rest when it prepared).
- Parameters: the target's address (`MigrationOrder.target_address`, which its agent
  reported with `target-ready`) as the libvirt URI `qemu+tcp://ADDRESS/system` the source's
  libvirtd connects to and the migration URI `tcp://ADDRESS` QEMU streams to;
  `bandwidthPerMigration` in MiB/s as KubeVirt rounds it (a limit under 1 MiB/s is 1).
- Watching: the job's statistics every report interval (`jobStats`: data total, processed,
  remaining), judged by KubeVirt's monitor (`nodeagent.migration.monitor`): past the
  completion timeout post-copy starts (`migrateStartPostCopy`) when allowed; stuck or past
  it otherwise, the job is aborted (`abortJob`), as it is on a cancel or an agent stop.

libvirt decides the outcome: `migrateToURI3` returning means the guest runs on the target
(the source's domain is left shut off, reason migrated, for its cleanup to undefine); an
error means it still runs here, whatever asked for the abort. A transfer started by an agent
killed since runs on in libvirtd: `settle` aborts it if it still runs, and says where the
guest ended.
"""

from __future__ import annotations

import asyncio
import time
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from typing import Any, Final

import libvirt
import msgspec
import structlog

from events.language.messages import MigrationOrder
from nodeagent.migration import Transfer, measured, monitor
from nodeagent.virterror import is_no_domain

log = structlog.get_logger(__name__)

MiB: Final = 1 << 20
TARGET_LIBVIRT_URI: Final = "qemu+tcp://{host}/system"
TARGET_MIGRATION_URI: Final = "tcp://{host}"
NO_ADDRESS_REASON: Final = "the target reported no migration address"
HALTED: Final = "halted"
SETTLE_POLL_SECONDS: Final = 0.2
"""How often `settle` asks libvirt whether an aborted job has ended."""


def uri_host(address: str) -> str:
    """The address as a URI's host: an IPv6 address in brackets."""
    return f"[{address}]" if ":" in address else address


def disks_to_copy(domain_xml: str) -> list[str]:
    """The target names (`vda`, ...) of the local disks block migration copies."""
    out = []
    for disk in ET.fromstring(domain_xml).iterfind("devices/disk"):
        if disk.get("type") != "file" or disk.get("device", "disk") != "disk":
            continue
        if disk.find("readonly") is not None or disk.find("shareable") is not None:
            continue
        target = disk.find("target")
        if target is not None and target.get("dev"):
            out.append(target.get("dev", ""))
    return out


def migration_flags(order: MigrationOrder, copy_disks: bool) -> int:
    flags = int(libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER
                | libvirt.VIR_MIGRATE_PERSIST_DEST)
    if copy_disks:
        flags |= libvirt.VIR_MIGRATE_NON_SHARED_INC
    if order.allow_auto_converge:
        flags |= libvirt.VIR_MIGRATE_AUTO_CONVERGE
    if order.allow_post_copy:
        flags |= libvirt.VIR_MIGRATE_POSTCOPY
    return flags


def migration_params(order: MigrationOrder, disks: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {
        libvirt.VIR_MIGRATE_PARAM_URI: TARGET_MIGRATION_URI.format(
            host=uri_host(order.target_address))}
    if order.bandwidth_bytes_per_second:
        params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = max(
            1, order.bandwidth_bytes_per_second // MiB)
    if disks:
        params[libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS] = disks
    return params


async def transfer(conn: libvirt.virConnect, domain: str, order: MigrationOrder, *,
                   interval: float, halt: asyncio.Event,
                   progress: Callable[[Transfer], Awaitable[None]]) -> tuple[Transfer, bool]:
    """Migrate `domain` to the order's target, reporting `progress` every `interval`, until
    libvirt says how it ended: converged (the guest runs on the target) or failed (it runs
    here). Returns that and whether `halt` cut it short."""
    dom = await asyncio.to_thread(conn.lookupByName, domain)
    disks = disks_to_copy(await asyncio.to_thread(dom.XMLDesc, 0))
    dconnuri = TARGET_LIBVIRT_URI.format(host=uri_host(order.target_address))
    params = migration_params(order, disks)
    flags = migration_flags(order, bool(disks))
    log.info("migrating", domain=domain, target=dconnuri, params=params, flags=flags)
    job = asyncio.ensure_future(asyncio.to_thread(dom.migrateToURI3, dconnuri, params, flags))
    halted = asyncio.ensure_future(halt.wait())
    watch = _Watch(dom, order)
    try:
        while not job.done():
            await asyncio.wait({job} if watch.verdict else {job, halted}, timeout=interval,
                               return_when=asyncio.FIRST_COMPLETED)
            if job.done() or watch.verdict:
                continue
            if halt.is_set():
                await watch.abort(HALTED)
            elif (moved := await watch.step()) is not None:
                await progress(moved)
    finally:
        halted.cancel()
    return watch.outcome(job)


class _Watch:
    """One migration job under watch: its figures so far, and why we aborted it."""

    def __init__(self, dom: libvirt.virDomain, order: MigrationOrder) -> None:
        self.dom, self.order = dom, order
        self.start = time.monotonic()
        self.current = Transfer(total=0, remaining=0, lowest=2**63)
        self.verdict = ""

    async def abort(self, why: str) -> None:
        log.warning("aborting the migration", domain=self.dom.name(), reason=why)
        self.verdict = why
        await asyncio.to_thread(_abort, self.dom)

    async def step(self) -> Transfer | None:
        """The job's figures now, judged (post-copy started, or the job aborted, as the
        monitor says); None when there is nothing to report."""
        try:
            stats = await asyncio.to_thread(self.dom.jobStats, 0)
        except libvirt.libvirtError as e:  # as virt-launcher: asked again next time
            log.info("no job statistics", domain=self.dom.name(), error=str(e))
            return None
        if stats.get("type") != libvirt.VIR_DOMAIN_JOB_UNBOUNDED:
            return None  # not started yet, or just ended
        current = msgspec.structs.replace(
            measured(self.current, elapsed=time.monotonic() - self.start,
                     processed=int(stats.get("data_processed", 0)),
                     remaining=int(stats.get("data_remaining", 0))),
            total=int(stats.get("data_total", 0)))
        judged = monitor(current, progress_timeout=self.order.progress_timeout_seconds,
                         completion_timeout=self.order.completion_timeout_seconds,
                         allow_post_copy=self.order.allow_post_copy)
        if judged.mode != current.mode:
            log.info("starting post-copy", domain=self.dom.name())
            try:
                await asyncio.to_thread(self.dom.migrateStartPostCopy, 0)
            except libvirt.libvirtError as e:  # still pre-copy: tried again next time
                log.warning("post-copy not started", domain=self.dom.name(), error=str(e))
                judged = msgspec.structs.replace(judged, mode=current.mode)
        self.current = msgspec.structs.replace(judged, state="running", reason="")
        if judged.state == "failed":
            await self.abort(judged.reason)
            return None
        return self.current

    def outcome(self, job: asyncio.Future[int]) -> tuple[Transfer, bool]:
        """libvirt's word on the ended job, and whether a halt cut it short."""
        halted = self.verdict == HALTED
        try:
            job.result()
        except libvirt.libvirtError as e:
            reason = self.verdict if self.verdict and not halted else str(e)
            return msgspec.structs.replace(self.current, state="failed", reason=reason), halted
        return msgspec.structs.replace(
            self.current, state="converged", remaining=0,
            processed=max(self.current.processed, self.current.total)), halted


def _abort(dom: libvirt.virDomain) -> None:
    """Abort the domain's job; one that has ended meanwhile needs none."""
    try:
        dom.abortJob()
    except libvirt.libvirtError as e:
        log.info("no job to abort", domain=dom.name(), error=str(e))


def settle(conn: libvirt.virConnect, domain: str) -> bool:
    """After an agent restart: abort the domain's migration if one still runs, wait for its
    job to end, and say whether the guest left (the domain is shut off, reason migrated)."""
    try:
        dom = conn.lookupByName(domain)
        if dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE:
            log.warning("aborting the migration an agent before started", domain=domain)
        while dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE:
            _abort(dom)
            time.sleep(SETTLE_POLL_SECONDS)  # libvirt announces no job's end to poll on
        state, reason = dom.state()
    except libvirt.libvirtError as e:
        if is_no_domain(e):
            return False
        raise
    return bool(state == libvirt.VIR_DOMAIN_SHUTOFF
                and reason == libvirt.VIR_DOMAIN_SHUTOFF_MIGRATED)


def arrived(conn: libvirt.virConnect, domain: str) -> bool:
    """On a target: the source has handed the guest over, so it runs here (its domain is
    active and not the incoming one QEMU keeps paused until the hand-over)."""
    try:
        state, reason = conn.lookupByName(domain).state()
    except libvirt.libvirtError as e:
        if is_no_domain(e):
            return False
        raise
    if state == libvirt.VIR_DOMAIN_PAUSED:
        return bool(reason != libvirt.VIR_DOMAIN_PAUSED_MIGRATION)
    return bool(state in (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_BLOCKED))
