"""The agent's side of live migration: the five migration verbs
(`events.language.messages.NodeVerb` has the table), the source's transfer, and what a
restarted agent makes of a migration it was part of.

The log decides where the guest runs: the source keeps its guest until migrate-cleanup, the
target starts one only on migrate-finish (dispatched once the control plane has appended
Succeeded and moved the VMI), so a kill of either agent anywhere leaves the guest on one
node. What each side must remember across a kill is in its work log's `MigrationBook`
(`nodeagent.worklog`), written before anyone hears of it:

- target: the prepared migration (its order and the VMI to start), then `target-ready`. A
  restarted target reserves its devices again, and its reconcile starts the guest of a
  prepared migration whose VMI the cluster has moved here (Succeeded before the finish).
- source: the migration, before its transfer starts; converged, before it says so. A
  restarted source reports every transfer that had not converged failed ("source agent
  restarted") and forgets it; a converged one is reported again (the cluster may not have
  heard) and kept, until migrate-cleanup or migrate-abort, or until its reconcile finds the
  VMI moved away, when the guest is removed as a cleanup would.

The `migrate` work item is acknowledged once its transfer has started: the transfer lasts
longer than the node stream's ack wait, and the book, not the item, is what survives a kill.

How the transfer goes is the host's (`Host.plan_transfer`): simulated on libvirt's test
driver (`nodeagent.simhost`), libvirt's own on a real hypervisor (`nodeagent.libvirthost`,
`nodeagent.livemigration`): there the target makes the guest's files and attaches its network
(the taps and MACs a launch would give it) when it prepares, and reports where it listens
with `target-ready` (its migration address); the source's libvirtd sends the guest there, and
`converged` means the guest runs on the target already (the source's domain is shut off). Its
finish adopts the running domain as a launch would; the source's cleanup undefines its copy
and removes its taps. A target whose migration failed releases what it prepared, unless
libvirt handed it the guest anyway (the source's late `converged` then moves the VMI there).
A source restarted meanwhile first lets libvirt settle the transfer the last agent started
(`Host.migrated_away`): converged if the guest left, else failed as above.

Migrations see of their agent only their `MigrationSite`: its node's guests (launched,
removed, their devices held and released), its reports, its work log and its host.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any, Final, Protocol

import libvirt
import msgspec
import structlog
from nats.errors import Error as NatsError

from events.api.errors import VirtbusError
from events.jetstream.transient import describe
from events.language.ids import random_uuid
from events.language.messages import (
    MigrationObservation,
    MigrationOrder,
    MigrationState,
    NodeCommand,
    NodeReport,
)
from nodeagent.defaults import SOURCE_RESTARTED_REASON
from nodeagent.host import Host, TransferPlan
from nodeagent.migration import Transfer
from nodeagent.vmiref import VMIRef
from nodeagent.worklog import (
    AppliedWork,
    IncomingMigration,
    MigrationBook,
    OutgoingMigration,
    WorkLog,
)

if TYPE_CHECKING:
    from events.api.vm import VirtualMachineInstanceSpec
    from nodeagent.converter import ConverterContext
    from nodeagent.readservice import Placed

log = structlog.get_logger(__name__)

MIGRATION_VERBS: Final = frozenset({"migrate-prepare", "migrate", "migrate-abort",
                                    "migrate-finish", "migrate-cleanup"})
TARGET_VERBS: Final = frozenset({"migrate-prepare", "migrate-finish"})
SOURCE_VERBS: Final = frozenset({"migrate", "migrate-abort"})
ANSWERED_VERBS: Final = frozenset({"migrate-prepare", "migrate"})
"""The verbs whose migration waits on this agent's report: a refused one is reported failed."""

ABORTED_REASON: Final = "aborted"


class MigrationSite(Protocol):
    """What migrations need of the node they run on, and all they get of its agent."""

    @property
    def node(self) -> str: ...

    @property
    def host(self) -> Host: ...

    @property
    def worklog(self) -> WorkLog: ...

    def hosts(self, domain: str) -> bool:
        """Whether the guest of that domain is here."""

    def uids(self) -> set[str]:
        """The VMI instances whose guests are here."""

    def reserve(self, uid: str, vmi: dict[str, Any]
                ) -> tuple[VirtualMachineInstanceSpec, ConverterContext]:
        """Convert the VMI as a launch would, and hold its devices for it."""

    def release_devices(self, uid: str) -> None: ...

    async def launch(self, vmi: dict[str, Any], ref: VMIRef) -> None:
        """Start the guest as the node's launch does."""

    async def remove(self, ref: VMIRef) -> object:
        """Stop and remove the guest, without a report."""

    async def report(self, report: NodeReport) -> None: ...

    async def report_launch_failed(self, ref: VMIRef, error: Exception) -> None: ...


class Transferring(msgspec.Struct, kw_only=True):
    """A transfer under way on this source: its task, and what stops it."""

    task: asyncio.Task[None]
    halt: asyncio.Event


class Migrations:
    """The migrations of one agent's node, in both directions."""

    def __init__(self, site: MigrationSite) -> None:
        self.site = site
        self.host = site.host
        self.worklog = site.worklog
        self.node = site.node
        self.log = log.bind(node=site.node)
        self.book = MigrationBook()
        self.transfers: dict[str, Transferring] = {}
        """By VMI uid."""
        self.saving = asyncio.Lock()
        """One write of the book at a time, each of the book as it is then: a write retried
        after a later one cannot put an older book back."""

    # -- what the node's work, start and reconcile hand over ----------------------------

    def refusal(self, command: NodeCommand) -> str:
        """Why a migration work item makes no sense here; '' when it does (or is no
        migration's)."""
        if command.verb not in MIGRATION_VERBS:
            return ""
        order = command.migration
        if order is None:
            return f"a {command.verb} command without its migration order"
        if order.source_node == order.target_node:
            return f"migration {order.uid}: source and target are both {order.source_node!r}"
        if command.verb in TARGET_VERBS and order.target_node != self.node:
            return f"migration {order.uid}: the target is {order.target_node!r}, not this node"
        if command.verb in SOURCE_VERBS and order.source_node != self.node:
            return f"migration {order.uid}: the source is {order.source_node!r}, not this node"
        if self.node not in (order.source_node, order.target_node):
            return f"migration {order.uid}: this node is neither its source nor its target"
        if min(order.bandwidth_bytes_per_second, order.progress_timeout_seconds,
               order.completion_timeout_seconds) < 0:
            return f"migration {order.uid}: a negative bandwidth or timeout"
        if command.verb in ANSWERED_VERBS and command.vmi is None:
            return f"a {command.verb} command without its VMI"
        if command.verb == "migrate" and not self.site.hosts(_ref(command).domain):
            return f"VMI {command.namespace}/{command.name} does not run on this node"
        return ""

    async def refused(self, command: NodeCommand, reason: str) -> None:
        """Tell the cluster a migration it waits on cannot go ahead here; a refusal that is
        not about this node's side of a migration is not this node's to report."""
        order = command.migration
        if order is None or command.verb not in ANSWERED_VERBS:
            return
        side = order.target_node if command.verb in TARGET_VERBS else order.source_node
        if side == self.node:
            await self._observe(order, _ref(command), "failed", reason=reason,
                                correlation_id=command.correlation_id)

    async def resume(self) -> None:
        """At start, before any work: what the last agent was migrating (module docstring)."""
        try:
            self.book = await self.worklog.migrations()
        except msgspec.DecodeError as e:
            self.log.error("migrations record unreadable; starting without", error=str(e))
        for uid, found in list(self.book.outgoing.items()):
            ref = VMIRef(found.namespace, found.name, uid)
            out = await self._settled(ref, found)
            if out.converged:
                await self._observe(out.order, ref, "converged")
                continue
            await self._observe(out.order, ref, "failed", reason=SOURCE_RESTARTED_REASON)
            await self.worklog.mark_applied(out.event_id, AppliedWork(uid=uid, verb="migrate"))
            await self._forget_outgoing(uid)
        for uid, incoming in self.book.incoming.items():
            try:
                self.site.reserve(uid, incoming.vmi)
            except VirtbusError as e:
                self.log.warning("devices of a prepared migration not reserved again",
                                 migration=incoming.order.uid, uid=uid, error=str(e))

    async def _settled(self, ref: VMIRef, out: OutgoingMigration) -> OutgoingMigration:
        """A real host's transfer the last agent left unfinished, once libvirt has settled
        it: converged (recorded) if the guest left."""
        if out.converged or not await self.host.migrated_away(ref.domain):
            return out
        out = self.book.outgoing[ref.uid] = msgspec.structs.replace(out, converged=True)
        await self._save()
        return out

    async def reconcile(self, assigned: Placed) -> None:
        """With the VMIs the cluster placed here: start the guest of each prepared migration
        whose VMI has moved here Running (its finish may never come: it was already taken),
        and remove the guest of each converged one whose VMI has moved away."""
        present = self.site.uids()
        for uid, incoming in list(self.book.incoming.items()):
            placed = assigned.get(uid)
            if placed is None or placed[1] != "Running":
                continue
            ref = placed[0]
            if uid in present:
                await self._forget_incoming(uid)
                continue
            self.log.info("starting the guest of a migration finished while the agent "
                          "was away", vmi=ref.name, migration=incoming.order.uid)
            try:
                await self._start(incoming.vmi, ref)
            except (VirtbusError, libvirt.libvirtError) as e:
                await self.site.report_launch_failed(ref, e)
        for uid, out in list(self.book.outgoing.items()):
            if out.converged and uid not in assigned:
                await self._depart(VMIRef(out.namespace, out.name, uid), out.order)

    async def serve(self, stop: asyncio.Event) -> None:
        """Until the agent stops; then every transfer ends where it is (the book keeps it:
        the next agent reports it failed)."""
        try:
            await stop.wait()
        finally:
            for transferring in self.transfers.values():
                transferring.halt.set()
            await asyncio.gather(*(t.task for t in self.transfers.values()),
                                 return_exceptions=True)

    async def execute(self, command: NodeCommand, ref: VMIRef) -> None:
        """One migration work item (`refusal` has passed it: its order names this node)."""
        order = command.migration
        if order is None:  # refused before; narrows the type
            return
        with structlog.contextvars.bound_contextvars(migration=order.uid):
            match command.verb:
                case "migrate-prepare":
                    await self._prepare(command, order, ref)
                case "migrate":
                    await self._migrate(command, order, ref)
                case "migrate-abort":
                    await self._abort(order, ref)
                case "migrate-finish":
                    await self._finish(command, order, ref)
                case "migrate-cleanup":
                    await self._clean_up(order, ref)

    # -- target ------------------------------------------------------------------------

    async def _prepare(self, command: NodeCommand, order: MigrationOrder, ref: VMIRef) -> None:
        """Check the guest can run here (its domain converts; its devices are free, and held
        for it), keep the order, say ready. The domain is not started."""
        known = self.book.incoming.get(ref.uid)
        if known is not None and known.order.uid == order.uid:
            await self._observe(order, ref, "target-ready")
            return
        vmi = command.vmi or {}
        if self.site.hosts(ref.domain):
            await self._observe(order, ref, "failed", reason="the guest already runs on the "
                                "target node")
            return
        if await self.worklog.finished(ref.uid):
            await self._observe(order, ref, "failed", reason="the VMI has finished on the "
                                "target node")
            return
        try:
            await self._make_ready(ref, vmi)
        except VirtbusError as e:
            await self._observe(order, ref, "failed", reason=f"target not ready: {e}")
            return
        self.book.incoming[ref.uid] = IncomingMigration(order=order, vmi=vmi)
        await self._save()
        await self._observe(order, ref, "target-ready",
                            target_address=self.host.migration_address())

    async def _make_ready(self, ref: VMIRef, vmi: dict[str, Any]) -> None:
        """Hold the guest's devices and, on a real host, make its files and attach its
        network as a launch does (the taps and MACs derive from the uid, so they are the
        ones the guest's domain names: its QEMU opens them here when it comes in, as
        virt-handler's migration target preparation makes the target pod's network); none
        of it stays if any fails."""
        spec, ctx = self.site.reserve(ref.uid, vmi)
        try:
            await self.host.make_files(spec, ctx)
            await self.host.attach(ref, spec)
        except (VirtbusError, OSError) as e:
            await self._unprepare(ref)
            raise VirtbusError(f"the guest's files or network: {e}") from e

    async def _unprepare(self, ref: VMIRef) -> None:
        """Release what `_make_ready` made for a guest that is not (and will not be) here."""
        self.site.release_devices(ref.uid)
        await self.host.release(ref)

    async def _finish(self, command: NodeCommand, order: MigrationOrder, ref: VMIRef) -> None:
        """Start the guest here as a launch does (a running one is left alone), and forget
        the migration."""
        known = self.book.incoming.get(ref.uid)
        vmi = known.vmi if known is not None and known.order.uid == order.uid else command.vmi
        if self.site.hosts(ref.domain):
            await self._forget_incoming(ref.uid)
        elif vmi is None:
            self.log.warning("migration finish: no prepared migration and no VMI; "
                             "nothing to start")
        else:
            await self._start(vmi, ref)

    async def _start(self, vmi: dict[str, Any], ref: VMIRef) -> None:
        """Start the guest as a launch does; the migration is over here, started or not (a
        guest that cannot start is its VMI's failure, reported as a launch's)."""
        try:
            await self.site.launch(vmi, ref)
        finally:
            await self._forget_incoming(ref.uid)

    async def _forget_incoming(self, uid: str) -> None:
        if self.book.incoming.pop(uid, None) is not None:
            await self._save()

    # -- source ------------------------------------------------------------------------

    async def _migrate(self, command: NodeCommand, order: MigrationOrder, ref: VMIRef) -> None:
        """Record the migration, report it running and start its transfer; the work item is
        acknowledged as soon as this returns."""
        known = self.book.outgoing.get(ref.uid)
        if known is not None and known.converged and known.order.uid != order.uid:
            await self._forget_outgoing(ref.uid)  # over: a new one starts after it finished
            known = None
        if known is not None:
            if known.order.uid != order.uid:
                await self._observe(order, ref, "failed", reason=f"migration "
                                    f"{known.order.uid} of this VMI is under way")
            elif known.converged:
                await self._observe(order, ref, "converged")
            return  # else its transfer runs, and reports
        try:
            plan = self.host.plan_transfer(
                order, command.vmi or {}, ref,
                progress=functools.partial(self._observe, order, ref, "progress"),
                still_here=lambda: self.site.hosts(ref.domain))
        except VirtbusError as e:
            await self._observe(order, ref, "failed", reason=str(e))
            return
        self.book.outgoing[ref.uid] = OutgoingMigration(
            order=order, namespace=ref.namespace, name=ref.name, event_id=command.event_id)
        await self._save()
        await self._observe(order, ref, "running", plan.first)
        halt = asyncio.Event()
        self.transfers[ref.uid] = Transferring(
            task=asyncio.create_task(self._transfer(order, ref, plan, halt)), halt=halt)

    async def _transfer(self, order: MigrationOrder, ref: VMIRef, plan: TransferPlan,
                        halt: asyncio.Event) -> None:
        """The transfer until it ends; then converged is recorded before it is said, and a
        failed one is said and forgotten."""
        try:
            transfer = await plan.run(halt)
            if transfer is None:
                return
            if transfer.state == "converged":
                self.book.outgoing[ref.uid] = msgspec.structs.replace(
                    self.book.outgoing[ref.uid], converged=True)
                await self._save()
                await self._observe(order, ref, "converged", transfer)
            else:
                await self._observe(order, ref, "failed", transfer, reason=transfer.reason)
                await self._forget_outgoing(ref.uid)
        except (TimeoutError, NatsError) as e:  # NATS gone for good: the agent stops
            self.log.warning("migration transfer not reported", vmi=ref.name,
                             error=describe(e))
        except Exception as e:  # a bug: the agent goes on, the next start fails the transfer
            self.log.error("migration transfer ended", vmi=ref.name, exc_info=e)
        finally:
            self.transfers.pop(ref.uid, None)

    async def _abort(self, order: MigrationOrder, ref: VMIRef) -> None:
        """Stop the transfer; the guest stays. Failed "aborted" if it was still going. One
        that converged first is kept: the cluster has heard `converged` and decides (the
        cleanup after Succeeded removes this copy; after Failed the next migration's order
        replaces it)."""
        transferring = self.transfers.get(ref.uid)
        if transferring is not None:
            transferring.halt.set()
            await transferring.task
        known = self.book.outgoing.get(ref.uid)
        if known is None or known.order.uid != order.uid:
            self.log.info("migration abort: no such migration here")
            return
        if not known.converged:
            await self._observe(order, ref, "failed", reason=ABORTED_REASON)
            await self._forget_outgoing(ref.uid)

    async def _clean_up(self, order: MigrationOrder, ref: VMIRef) -> None:
        """Source, after Succeeded: its copy of the guest goes. Target, after Failed: the
        prepared migration, its devices and, on a real host, its files go (unless the guest
        runs here)."""
        if order.source_node == self.node:
            known = self.book.outgoing.get(ref.uid)
            if known is not None and known.order.uid == order.uid:
                await self._depart(ref, order)
            return
        incoming = self.book.incoming.get(ref.uid)
        if incoming is None or incoming.order.uid != order.uid:
            return
        if await self._guest_here(ref):
            # libvirt handed the guest over before the migration failed: what it runs on
            # stays, for the source's late `converged` to move the VMI here
            self.log.warning("migration failed, yet its guest runs here: kept",
                             vmi=ref.name, migration=order.uid)
            return
        await self._unprepare(ref)
        await self._forget_incoming(ref.uid)

    async def _guest_here(self, ref: VMIRef) -> bool:
        """The guest runs on this node: adopted, or (a real host) its domain came in."""
        return self.site.hosts(ref.domain) or await self.host.arrived(ref.domain)

    async def _depart(self, ref: VMIRef, order: MigrationOrder) -> None:
        """The VMI runs on the target now: remove this copy without a word (a `gone` report
        from here would speak for a VMI that is no longer this node's), forget it."""
        self.log.info("removing the guest that migrated away", vmi=ref.name,
                      migration=order.uid, target=order.target_node)
        await self.site.remove(ref)
        await self._forget_outgoing(ref.uid)

    async def _forget_outgoing(self, uid: str) -> None:
        if self.book.outgoing.pop(uid, None) is not None:
            await self._save()

    # -- shared ------------------------------------------------------------------------

    async def _save(self) -> None:
        async with self.saving:
            await self.worklog.record_migrations(self.book)

    async def _observe(self, order: MigrationOrder, ref: VMIRef, state: MigrationState,
                       transfer: Transfer | None = None, *, reason: str = "",
                       correlation_id: str = "", target_address: str = "") -> None:
        """Report what this node sees of a migration."""
        obs = MigrationObservation(
            namespace=ref.namespace, name=ref.name, vmi_uid=ref.uid, migration_uid=order.uid,
            state=state, reason=reason, target_address=target_address)
        if transfer is not None:
            obs = msgspec.structs.replace(
                obs, mode=transfer.mode, data_total=transfer.total,
                data_processed=transfer.processed, data_remaining=transfer.remaining)
        self.log.info("migration observed", vmi=ref.name, namespace=ref.namespace,
                      migration=order.uid, state=state, reason=reason)
        await self.site.report(NodeReport(id=random_uuid(), node=self.node, kind="migration",
                                          migration=obs, correlation_id=correlation_id))


def _ref(command: NodeCommand) -> VMIRef:
    return VMIRef(command.namespace, command.name, command.uid)
