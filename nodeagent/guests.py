"""The node's guests: which domain is which VMI's, the devices each holds, the downwardMetrics
disks refreshed for it; and what is done to them: launch, stop, pause, unpause, restart,
removal.

A launch converts the VMI, makes its files and metrics disks, holds its devices, attaches its
network and defines and starts its domain; if libvirt or the network fails, nothing of it
stays. A removal stops and undefines the domain and releases all of it. A domain of the name
that another instance (uid) of the VMI holds, or another installation's, is left alone.
After every change the host is saved (`Host.save`), before anyone hears of it.
"""

from __future__ import annotations

import asyncio
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, Any

import libvirt
import msgspec
import structlog

from events.api.errors import InvalidSpec
from events.api.resources import vmi_resources
from events.api.spec_rules import START_PAUSED
from events.language.messages import DomainSummary, NodeReport
from events.runtime.aio import pause_unless_stopped
from nodeagent import downwardmetrics, lifecycle
from nodeagent.converter import convert
from nodeagent.converter.identity import VMI_METADATA_TAG
from nodeagent.devices import DeviceLedger
from nodeagent.domxml import parse_manifest
from nodeagent.host import Consoles, Host
from nodeagent.hostpaths import HostPathError
from nodeagent.network.tools import NetworkError
from nodeagent.phases import GuestPhase
from nodeagent.reporter import Reporter
from nodeagent.virterror import is_no_domain
from nodeagent.vmiref import VMIRef
from nodeagent.worklog import WorkLog

if TYPE_CHECKING:
    from collections.abc import Mapping

    from events.api.vm import VirtualMachineInstanceSpec
    from nodeagent.converter import ConverterContext

log = structlog.get_logger(__name__)


def vmi_of(dom: libvirt.virDomain, installation: str) -> VMIRef | None:
    """The VMI a domain belongs to, from the metadata the converter writes; None for a
    domain of no VMI, or of another installation's (two sharing a host leave each other's
    guests alone; a domain that names none is taken as this one's)."""
    found = ET.fromstring(dom.XMLDesc(0)).find(f"metadata/{VMI_METADATA_TAG}")
    if found is None or found.get("installation", installation) != installation:
        return None
    return VMIRef(found.get("namespace", ""), found.get("name", ""), found.get("uid", ""))


class Guests:
    """One node's guests (see the module)."""

    def __init__(self, host: Host, consoles: Consoles, reporter: Reporter, worklog: WorkLog, *,
                 installation: str, disk_dir: str, capacity: Mapping[str, int]) -> None:
        self.host, self.consoles, self.reporter, self.worklog = host, consoles, reporter, worklog
        self.node = reporter.node
        self.installation = installation
        """The agent's prefix, in its guests' metadata: whose domains are its own."""
        self.disk_dir = disk_dir
        self.capacity = capacity
        self.log = log.bind(node=self.node)
        self.domains: dict[str, VMIRef] = {}
        self.metrics_disks: dict[str, tuple[str, ...]] = {}
        """Domain name to the downwardMetrics disks the agent refreshes for it."""
        self.in_progress: dict[str, str] = {}
        """Domain name to the correlation id of the node command acting on it right now, so
        libvirt's echo of that action, if the watcher reports it first, carries the id too."""
        self.ledger = DeviceLedger(capacity, node=self.node)

    # -- found at start ----------------------------------------------------------------

    async def adopt(self, ref: VMIRef) -> None:
        """A guest found at start is ours again."""
        self.domains[ref.domain] = ref
        await self.consoles.follow(ref)

    def count_adopted_devices(self) -> None:
        """Once every guest is adopted: each holds one of each device (even past capacity)
        until its VMI's spec says what its launch took (`adopt_spec`)."""
        self.ledger = DeviceLedger.rebuild(self.capacity, list(self.uids()), node=self.node)

    def adopt_spec(self, ref: VMIRef, vmi: dict[str, Any]) -> None:
        """An adopted guest holds the devices its VMI's spec says, and has its metrics disks
        refreshed again; a spec that no longer parses keeps the safe count, and one whose
        metrics disks would lie outside the VMI's directory has none refreshed."""
        try:
            spec, ctx = parse_manifest(vmi, domain_type=self.host.domain_type,
                                       disk_dir=self.disk_dir)
        except InvalidSpec as e:
            self.log.warning("devices of an adopted guest left as counted", vmi=ref.name,
                             error=str(e))
            return
        self.ledger.correct(ref.uid, self.device_demand(spec))
        try:
            disks = downwardmetrics.disk_paths(spec, ctx)
        except HostPathError as e:
            self.log.warning("metrics disks of an adopted guest not refreshed", vmi=ref.name,
                             error=str(e))
            return
        if disks:
            self.metrics_disks[ref.domain] = disks

    # -- what migrations need of the node (`nodeagent.migrating.MigrationSite`) ---------

    def hosts(self, domain: str) -> bool:
        """Whether the guest of that domain is here."""
        return domain in self.domains

    def uids(self) -> set[str]:
        """The VMI instances whose guests are here."""
        return {ref.uid for ref in self.domains.values()}

    def reserve(self, uid: str, vmi: dict[str, Any]
                ) -> tuple[VirtualMachineInstanceSpec, ConverterContext]:
        """Convert the VMI as a launch would, and hold its devices for it."""
        spec, ctx = parse_manifest(vmi, domain_type=self.host.domain_type, disk_dir=self.disk_dir)
        convert(spec, ctx)
        self.ledger.acquire(uid, self.device_demand(spec))
        return spec, ctx

    def release_devices(self, uid: str) -> None:
        self.ledger.release(uid)

    async def report(self, report: NodeReport) -> None:
        await self.reporter.report(report)

    async def report_launch_failed(self, ref: VMIRef, error: Exception) -> None:
        await self.reporter.report_launch_failed(ref, error)

    # -- node work -----------------------------------------------------------------------

    async def launch(self, vmi: dict[str, Any] | None, ref: VMIRef) -> None:
        """Convert, make the files and metrics disks, define and start. Every host path is
        made and checked (`nodeagent.hostpaths`) by the conversion, before any file is created
        or the domain defined: a path outside the VMI's directory fails the launch."""
        if await self.worklog.finished(ref.uid):
            self.log.info("launch of a finished VMI: nothing to do", uid=ref.uid)
            return
        if vmi is None:
            raise InvalidSpec("vmi", "a launch needs the VMI")
        spec, ctx = parse_manifest(vmi, domain_type=self.host.domain_type, disk_dir=self.disk_dir)
        ctx = self.host.guest_context(
            ref, spec, msgspec.structs.replace(ctx, installation=self.installation))
        xml = convert(spec, ctx)
        metrics_disks = downwardmetrics.disk_paths(spec, ctx)
        await self.host.make_files(spec, ctx)
        for path in metrics_disks:
            await asyncio.to_thread(downwardmetrics.create_disk, path)
        self.ledger.acquire(ref.uid, self.device_demand(spec))
        start_paused = spec.start_strategy == START_PAUSED
        self.reporter.reported[ref.uid] = (GuestPhase.RUNNING, start_paused, "")
        self.domains[ref.domain] = ref
        if metrics_disks:
            self.metrics_disks[ref.domain] = metrics_disks
        try:
            await self.host.attach(ref, spec)
            dom = await asyncio.to_thread(lifecycle.define_and_start, self.host.conn, xml,
                                          paused=start_paused)
        except (libvirt.libvirtError, NetworkError):
            await self.remove(ref)  # the launch fails: nothing of it stays
            raise
        await self.consoles.follow(ref)
        paused = (await asyncio.to_thread(dom.state))[0] == libvirt.VIR_DOMAIN_PAUSED
        await self.host.save()
        await self.reporter.report_domain(ref, GuestPhase.RUNNING, "launched", paused=paused)

    async def stop(self, ref: VMIRef, grace_seconds: int) -> None:
        outcome = await self.remove(ref, grace_seconds)
        await self.reporter.report_domain(ref, GuestPhase.SUCCEEDED,
                                          f"stopped on request ({outcome})", gone=True)

    async def pause(self, ref: VMIRef) -> None:
        await asyncio.to_thread(lifecycle.pause, self.host.conn, ref.domain)
        await self.host.save()

    async def unpause(self, ref: VMIRef) -> None:
        await asyncio.to_thread(lifecycle.unpause, self.host.conn, ref.domain)
        await self.host.save()

    async def restart(self, ref: VMIRef) -> None:
        await asyncio.to_thread(lifecycle.restart, self.host.conn, ref.domain, self.host.watcher)
        await self.host.save()

    async def remove(self, ref: VMIRef, grace_seconds: int = 0) -> lifecycle.StopOutcome:
        """Stop (if it still runs; at once unless given a grace period) and undefine a domain,
        and forget it. A domain of the name that another instance (uid) of the VMI holds is
        not this one's: left alone, as this one is gone (a stop of a VMI failed on a lost
        node may come after its replacement was launched here)."""
        if await self.another_instances(ref, "stopped"):
            return lifecycle.StopOutcome.ALREADY_GONE
        outcome = await asyncio.to_thread(lifecycle.graceful_stop, self.host.conn, ref.domain,
                                          grace_seconds, self.host.watcher)
        await self.consoles.forget(ref)  # its last words, before its log goes
        await self.host.release(ref)
        self.ledger.release(ref.uid)
        self.reporter.reported.pop(ref.uid, None)
        self.domains.pop(ref.domain, None)
        self.metrics_disks.pop(ref.domain, None)
        await self.host.save()
        return outcome

    async def another_instances(self, ref: VMIRef, what: str) -> bool:
        """Whether the domain of `ref`'s name is another instance's (another uid, another
        installation's, no VMI's): then it is left alone, and that is logged."""
        held = self.domains.get(ref.domain)
        if held is None:  # not known here: whose it is, its metadata says
            held = await asyncio.to_thread(self._holder, ref)
        if held is None or held.uid == ref.uid:
            return False
        self.log.info(f"not {what}: the domain is another instance's", vmi=ref.name,
                      namespace=ref.namespace, uid=ref.uid, holder=held.uid)
        return True

    def _holder(self, ref: VMIRef) -> VMIRef | None:
        """Whose the domain of `ref`'s name is, by the metadata the converter wrote: None
        when there is no such domain; a holder of no uid when it is no VMI's of this
        installation (another installation's on a shared host, or no VMI's at all)."""
        try:
            dom = self.host.conn.lookupByName(ref.domain)
        except libvirt.libvirtError as e:
            if is_no_domain(e):
                return None
            raise
        return vmi_of(dom, self.installation) or VMIRef(ref.namespace, ref.name, "")

    def device_demand(self, spec: VirtualMachineInstanceSpec) -> dict[str, int]:
        """The device-plugin resources a VMI's launch takes (hugepages are not devices)."""
        demand = vmi_resources(spec.domain, emulation=self.host.domain_type != "kvm").extended
        tracked = self.ledger.tracked()
        return {k: v for k, v in demand.items() if k in tracked}

    def summaries(self) -> list[DomainSummary]:
        """The host's guests that belong to VMIs, as libvirt reports them now."""
        out = []
        for dom in self.host.conn.listAllDomains(0):
            ref = vmi_of(dom, self.installation)
            if ref is not None:
                out.append(DomainSummary(name=dom.name(), uid=ref.uid, state=dom.state()[0]))
        return out

    # -- downward metrics ----------------------------------------------------------------

    async def refresh_metrics(self, stop: asyncio.Event, interval: float,
                              active: asyncio.Event) -> None:
        """Rewrite each guest's downwardMetrics disks every `interval`, as virt-handler does;
        a failure is logged and the next tick tries again. A silenced agent writes nothing."""
        while not stop.is_set():
            await pause_unless_stopped(stop, interval)
            if stop.is_set() or not active.is_set() or not self.metrics_disks:
                continue
            try:
                host = await asyncio.to_thread(downwardmetrics.host_sample, self.host.conn,
                                               self.node)
            except libvirt.libvirtError as e:
                self.log.warning("downward metrics not written; trying again", error=str(e))
                continue
            for domain, disks in list(self.metrics_disks.items()):
                ref = self.domains.get(domain)
                if ref is None:
                    continue  # removed since this tick began
                try:
                    await asyncio.to_thread(downwardmetrics.refresh, self.host.conn, domain,
                                            disks, host)
                except (libvirt.libvirtError, downwardmetrics.MetricsDiskError) as e:
                    self.log.warning("downward metrics not written; trying again", vmi=ref.name,
                                     namespace=ref.namespace, error=str(e))
