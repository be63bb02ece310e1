"""The node's domains against what the cluster wants of them, as virt-handler keeps them.

At start the agent adopts the domains it finds that are its installation's (`adopt`), then
asks the read service which VMIs the cluster placed on its node (`reconcile`): an adopted
guest takes its devices and metrics disks from its VMI's spec, a VMI that was Running here
but has no domain any more is reported gone, and a domain no active VMI here owns is marked
finished and removed (a prepared incoming migration's guest excepted: the migration settles
it). If the read service does not answer in time the agent starts without reconciling.

From then on it reports what libvirt says of its guests (`watch_lifecycle`): a guest that
stops on its own (poweroff, crash) is reported with its phase and then removed, so the VMI's
replacement can take its name; and each guest agent that connects or disconnects
(`watch_guest_agents`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import libvirt
from nats.errors import Error as NatsError

from events.jetstream.transient import describe
from nodeagent import lifecycle
from nodeagent.defaults import DOMAIN_MISSING_REASON
from nodeagent.guestagent import running_verdict
from nodeagent.guests import vmi_of
from nodeagent.phases import GuestPhase, StopCause, judge
from nodeagent.readservice import ReadServiceUnavailable
from nodeagent.reporter import serving

if TYPE_CHECKING:
    from nodeagent.guests import Guests
    from nodeagent.host import Host
    from nodeagent.migrating import Migrations
    from nodeagent.phases import Observation
    from nodeagent.readservice import ReadService
    from nodeagent.reporter import Reporter
    from nodeagent.vmiref import VMIRef
    from nodeagent.worklog import WorkLog


class Reconciler:
    """One node's domains, reconciled (see the module)."""

    def __init__(self, host: Host, guests: Guests, reporter: Reporter, reads: ReadService,
                 migrations: Migrations, *, worklog: WorkLog, busy: asyncio.Lock) -> None:
        self.host, self.guests, self.reporter, self.reads = host, guests, reporter, reads
        self.migrations, self.worklog = migrations, worklog
        self.busy = busy
        """The agent's: held while a node command runs or the agent reconciles."""
        self.log = guests.log

    async def adopt(self) -> None:
        """After a restart: find our guests, rebuild the device ledger, report their phase."""
        for dom in await asyncio.to_thread(self.host.conn.listAllDomains, 0):
            ref = vmi_of(dom, self.guests.installation)
            if ref is None:
                continue
            await self.guests.adopt(ref)
            found = judge(*dom.state())
            if found.phase is not None:
                connected = await self.host.agent_connected(dom) \
                    if found.phase is GuestPhase.RUNNING else None
                await self.reporter.report_domain(
                    ref, found.phase, "found at agent start", paused=found.paused,
                    paused_reason=found.paused_reason, agent_connected=connected)
        self.guests.count_adopted_devices()

    async def reconcile(self) -> None:
        """Compare this host's domains with the VMIs the cluster placed here (see above)."""
        async with self.busy:
            try:
                placed = await self.reads.placed()
            except ReadServiceUnavailable as e:
                self.log.warning("not reconciled: the read service did not answer", error=str(e))
                return
            await self.migrations.reconcile(placed)
            present = self.guests.uids()
            for ref, phase, vmi in placed.values():
                if ref.uid in present:
                    self.guests.adopt_spec(ref, vmi)
                elif phase == GuestPhase.RUNNING:
                    await self.reporter.report_domain(ref, GuestPhase.FAILED,
                                                      DOMAIN_MISSING_REASON, gone=True)
            for ref in list(self.guests.domains.values()):
                # A prepared migration's guest is the migration's to settle (its finish, its
                # cleanup, or its VMI moving here): libvirt may have handed it over already.
                if ref.uid not in placed and ref.uid not in self.migrations.book.incoming:
                    self.log.warning("removing a domain no active VMI here owns", vmi=ref.name,
                                     namespace=ref.namespace, uid=ref.uid)
                    await self.worklog.record_finished(ref.uid, "no active VMI here owns it")
                    await self.guests.remove(ref)

    async def watch_lifecycle(self, stop: asyncio.Event) -> None:
        """Report what libvirt says of our guests; what NATS fails for a moment is retried
        in place, and what it refuses is one line: this never stops."""
        while not stop.is_set():
            try:
                obs = await asyncio.wait_for(self.host.observations.get(), 1.0)
            except TimeoutError:
                continue
            ref = self.guests.domains.get(obs.name)
            phase = obs.verdict.phase
            if ref is None or phase is None or obs.cause is StopCause.REQUESTED:
                continue  # not ours, no change, or a stop whose command reports it
            with serving(self.guests.in_progress.get(ref.domain, "")):
                try:
                    if phase is GuestPhase.RUNNING:
                        await self._report_running(ref, obs)
                    else:
                        await self.guests.remove(ref)
                        await self.reporter.report_domain(ref, phase, obs.reason, gone=True)
                except (TimeoutError, NatsError) as e:
                    self.log.warning("observation not reported", vmi=ref.name,
                                     namespace=ref.namespace, phase=phase, error=describe(e))
                except libvirt.libvirtError as e:  # the next event, or the reconcile, tells
                    self.log.error("observation not reported: libvirt failed", vmi=ref.name,
                                   namespace=ref.namespace, phase=phase, error=str(e))

    async def _report_running(self, ref: VMIRef, obs: Observation) -> None:
        """A running guest's pause state as it is now, unless reported so already."""
        verdict = await asyncio.to_thread(lifecycle.verdict_now, self.host.conn, obs)
        seen = (GuestPhase.RUNNING, verdict.paused, verdict.paused_reason)
        if self.reporter.reported.get(ref.uid) == seen:
            return  # reported already, as it is
        await self.host.save()
        await self.reporter.report_domain(ref, GuestPhase.RUNNING, obs.reason,
                                          paused=verdict.paused,
                                          paused_reason=verdict.paused_reason)

    async def watch_guest_agents(self, stop: asyncio.Event) -> None:
        """Report each guest agent that connects or disconnects, with its guest's state now
        (a guest that stopped meanwhile has its stop reported instead), while no node
        command runs: a pause's report and this one say the same of the pause."""
        while not stop.is_set():
            try:
                change = await asyncio.wait_for(self.host.agent_changes.get(), 1.0)
            except TimeoutError:
                continue
            ref = self.guests.domains.get(change.name)
            if ref is None:
                continue
            try:
                async with self.busy:
                    now = await asyncio.to_thread(running_verdict, self.host.conn, change.name)
                    if now is not None:
                        await self.reporter.report_domain(
                            ref, GuestPhase.RUNNING, paused=now.paused,
                            paused_reason=now.paused_reason, agent_connected=change.connected)
            except (TimeoutError, NatsError, libvirt.libvirtError) as e:
                self.log.warning("guest agent change not reported", vmi=ref.name,
                                 namespace=ref.namespace, error=describe(e))
