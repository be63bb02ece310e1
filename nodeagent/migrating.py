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

On libvirt's test driver the transfer is simulated (`nodeagent.migration`), from the guest's
memory, the link (the agent's `sim_migration_bandwidth`, or the migration's bandwidth when
lower) and the guest's dirty rate (its VMI's `virtbus.io/simulated-dirty-rate`, else the
agent's `sim_dirty_rate`). On a real hypervisor libvirt migrates (`nodeagent.livemigration`):
the target makes the guest's files and attaches its network (the taps and MACs a launch
would give it) when it prepares, and reports where it listens with `target-ready` (its
`migration_address`); the source's libvirtd sends the guest there, and `converged` means
the guest runs on the target already (the source's domain is shut off). Its finish adopts
the running domain as a launch would; the source's cleanup undefines its copy and removes
its taps. A target whose migration failed releases what it prepared, unless libvirt handed
it the guest anyway (the source's late `converged` then moves the VMI there). A source
restarted meanwhile first lets libvirt settle the transfer the last agent started
(`livemigration.settle`): converged if the guest left, else failed as above.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import libvirt
import msgspec
import structlog
from nats.errors import Error as NatsError

from events.api.errors import VirtbusError
from events.api.resources import guest_memory_bytes, quantity
from events.jetstream.transient import describe
from events.language.ids import random_uuid
from events.language.messages import (
    SIMULATED_DIRTY_RATE_ANNOTATION,
    MigrationObservation,
    MigrationOrder,
    MigrationState,
    NodeCommand,
    NodeReport,
)
from events.runtime.aio import pause_unless_stopped
from nodeagent import guestdisks, livemigration
from nodeagent.converter import convert
from nodeagent.converter import defaults as converter_defaults
from nodeagent.defaults import SOURCE_RESTARTED_REASON
from nodeagent.domxml import parse_manifest
from nodeagent.hypervisor import guest_owner
from nodeagent.migration import Link, Transfer, advance, begin
from nodeagent.vmiref import VMIRef
from nodeagent.worklog import AppliedWork, IncomingMigration, MigrationBook, OutgoingMigration

if TYPE_CHECKING:
    from events.api.vm import VirtualMachineInstanceSpec
    from nodeagent.agent import NodeAgent
    from nodeagent.converter import ConverterContext

MIGRATION_VERBS: Final = frozenset({"migrate-prepare", "migrate", "migrate-abort",
                                    "migrate-finish", "migrate-cleanup"})
TARGET_VERBS: Final = frozenset({"migrate-prepare", "migrate-finish"})
SOURCE_VERBS: Final = frozenset({"migrate", "migrate-abort"})
ANSWERED_VERBS: Final = frozenset({"migrate-prepare", "migrate"})
"""The verbs whose migration waits on this agent's report: a refused one is reported failed."""

ABORTED_REASON: Final = "aborted"
SOURCE_LOST_DOMAIN_REASON: Final = "the source lost the domain"

TransferRun = Callable[[asyncio.Event], Awaitable[Transfer | None]]
"""A transfer, simulated or real, until it ends (None: halted before it ended)."""


class Transferring(msgspec.Struct, kw_only=True):
    """A transfer under way on this source: its task, and what stops it."""

    task: asyncio.Task[None]
    halt: asyncio.Event


class Migrations:
    """The migrations of one agent's node, in both directions."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent
        self.node = agent.cfg.node
        self.book = MigrationBook()
        self.transfers: dict[str, Transferring] = {}
        """By VMI uid."""
        self.saving = asyncio.Lock()
        """One write of the book at a time, each of the book as it is then: a write retried
        after a later one cannot put an older book back."""

    # -- hooks of the agent ------------------------------------------------------------

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
        if command.verb == "migrate" and _ref(command).domain not in self.agent.domains:
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
            self.book = await self.agent._nats(self.agent.worklog.migrations,
                                               "reading the migrations")
        except msgspec.DecodeError as e:
            self.agent.log.error("migrations record unreadable; starting without", error=str(e))
        for uid, found in list(self.book.outgoing.items()):
            ref = VMIRef(found.namespace, found.name, uid)
            out = await self._settled(ref, found)
            if out.converged:
                await self._observe(out.order, ref, "converged")
                continue
            await self._observe(out.order, ref, "failed", reason=SOURCE_RESTARTED_REASON)
            await self.agent._nats(functools.partial(
                self.agent.worklog.mark_applied, out.event_id,
                AppliedWork(uid=uid, verb="migrate")), "recording applied work")
            await self._forget_outgoing(uid)
        for uid, incoming in self.book.incoming.items():
            try:
                self._reserve(uid, incoming.vmi)
            except VirtbusError as e:
                self.agent.log.warning("devices of a prepared migration not reserved again",
                                       migration=incoming.order.uid, uid=uid, error=str(e))

    async def _settled(self, ref: VMIRef, out: OutgoingMigration) -> OutgoingMigration:
        """A real host's transfer the last agent left unfinished, once libvirt has settled
        it: converged (recorded) if the guest left."""
        if out.converged or self.agent.cfg.simulated or not await asyncio.to_thread(
                livemigration.settle, self.agent.conn, ref.domain):
            return out
        out = self.book.outgoing[ref.uid] = msgspec.structs.replace(out, converged=True)
        await self._save()
        return out

    async def reconcile(self, assigned: dict[str, tuple[VMIRef, str, dict[str, Any]]]) -> None:
        """With the VMIs the cluster placed here: start the guest of each prepared migration
        whose VMI has moved here Running (its finish may never come: it was already taken),
        and remove the guest of each converged one whose VMI has moved away."""
        present = {ref.uid for ref in self.agent.domains.values()}
        for uid, incoming in list(self.book.incoming.items()):
            placed = assigned.get(uid)
            if placed is None or placed[1] != "Running":
                continue
            ref = placed[0]
            if uid in present:
                await self._forget_incoming(uid)
                continue
            self.agent.log.info("starting the guest of a migration finished while the agent "
                                "was away", vmi=ref.name, migration=incoming.order.uid)
            try:
                await self._start(incoming.vmi, ref)
            except (VirtbusError, libvirt.libvirtError) as e:
                await self.agent.report_launch_failed(ref, e)
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
        if ref.domain in self.agent.domains:
            await self._observe(order, ref, "failed", reason="the guest already runs on the "
                                "target node")
            return
        if await self.agent._nats(lambda: self.agent.worklog.finished(ref.uid),
                                  "looking up a finished VMI"):
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
        await self._observe(order, ref, "target-ready", target_address=self._address())

    async def _make_ready(self, ref: VMIRef, vmi: dict[str, Any]) -> None:
        """Hold the guest's devices and, on a real host, make its files and attach its
        network as a launch does (the taps and MACs derive from the uid, so they are the
        ones the guest's domain names: its QEMU opens them here when it comes in, as
        virt-handler's migration target preparation makes the target pod's network); none
        of it stays if any fails."""
        spec, ctx = self._reserve(ref.uid, vmi)
        if self.agent.cfg.simulated:
            return
        try:
            await asyncio.to_thread(guestdisks.prepare, spec, ctx, self.agent.images,
                                    guest_owner(self.agent.capabilities, self.agent.domain_type))
            if self.agent.network is not None:
                await asyncio.to_thread(self.agent.network.attach, ref, spec)
        except (VirtbusError, OSError) as e:
            await self._unprepare(ref)
            raise VirtbusError(f"the guest's files or network: {e}") from e

    async def _unprepare(self, ref: VMIRef) -> None:
        """Release what `_make_ready` made for a guest that is not (and will not be) here."""
        self.agent.ledger.release(ref.uid)
        if self.agent.cfg.simulated:
            return
        await asyncio.to_thread(guestdisks.remove, self.agent.cfg.disk_dir,
                                converter_defaults.RUN_DIR, ref.namespace, ref.name, ref.uid)
        if self.agent.network is not None:
            await asyncio.to_thread(self.agent.network.detach, ref.uid)

    def _address(self) -> str:
        """Where this host takes migrations in; '' on the test driver (nothing listens)."""
        if self.agent.cfg.simulated:
            return ""
        return self.agent.cfg.migration_address or socket.gethostname()

    def _reserve(self, uid: str, vmi: dict[str, Any]
                 ) -> tuple[VirtualMachineInstanceSpec, ConverterContext]:
        """Convert the VMI as a launch would, and hold its devices for it."""
        spec, ctx = parse_manifest(vmi, domain_type=self.agent.domain_type,
                                   disk_dir=self.agent.cfg.disk_dir)
        convert(spec, ctx)
        self.agent.ledger.acquire(uid, self.agent._device_demand(spec))
        return spec, ctx

    async def _finish(self, command: NodeCommand, order: MigrationOrder, ref: VMIRef) -> None:
        """Start the guest here as a launch does (a running one is left alone), and forget
        the migration."""
        known = self.book.incoming.get(ref.uid)
        vmi = known.vmi if known is not None and known.order.uid == order.uid else command.vmi
        if ref.domain in self.agent.domains:
            await self._forget_incoming(ref.uid)
        elif vmi is None:
            self.agent.log.warning("migration finish: no prepared migration and no VMI; "
                                   "nothing to start")
        else:
            await self._start(vmi, ref)

    async def _start(self, vmi: dict[str, Any], ref: VMIRef) -> None:
        """Start the guest as a launch does; the migration is over here, started or not (a
        guest that cannot start is its VMI's failure, reported as a launch's)."""
        try:
            await self.agent._launch(vmi, ref)
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
        first: Transfer | None = None
        run: TransferRun
        if self.agent.cfg.simulated:
            try:
                link = self._link(command.vmi or {}, order)
            except VirtbusError as e:
                await self._observe(order, ref, "failed", reason=str(e))
                return
            first = begin(link)
            run = functools.partial(self._simulate, order, ref, link, first)
        elif not order.target_address:
            await self._observe(order, ref, "failed", reason=livemigration.NO_ADDRESS_REASON)
            return
        else:
            run = functools.partial(self._hypervisor_transfer, order, ref)
        self.book.outgoing[ref.uid] = OutgoingMigration(
            order=order, namespace=ref.namespace, name=ref.name, event_id=command.event_id)
        await self._save()
        await self._observe(order, ref, "running", first)
        halt = asyncio.Event()
        self.transfers[ref.uid] = Transferring(
            task=asyncio.create_task(self._transfer(order, ref, run, halt)), halt=halt)

    def _link(self, vmi: dict[str, Any], order: MigrationOrder) -> Link:
        """The simulated transfer's guest, link and limits (module docstring)."""
        spec, _ = parse_manifest(vmi, domain_type=self.agent.domain_type,
                                 disk_dir=self.agent.cfg.disk_dir)
        annotations = (vmi.get("metadata") or {}).get("annotations") or {}
        dirty_rate = self.agent.cfg.sim_dirty_rate
        if SIMULATED_DIRTY_RATE_ANNOTATION in annotations:
            given = annotations[SIMULATED_DIRTY_RATE_ANNOTATION]
            try:
                dirty_rate = int(quantity(given))
            except (ValueError, TypeError, ArithmeticError):
                raise VirtbusError(f"annotation {SIMULATED_DIRTY_RATE_ANNOTATION}: not a "
                                   f"quantity per second: {given!r}") from None
        bandwidth = self.agent.cfg.sim_migration_bandwidth
        if order.bandwidth_bytes_per_second:
            bandwidth = min(bandwidth, order.bandwidth_bytes_per_second)
        return Link(memory=guest_memory_bytes(spec.domain), bandwidth=bandwidth,
                    dirty_rate=max(dirty_rate, 0),
                    progress_timeout=order.progress_timeout_seconds,
                    completion_timeout=order.completion_timeout_seconds,
                    allow_post_copy=order.allow_post_copy,
                    allow_auto_converge=order.allow_auto_converge)

    async def _simulate(self, order: MigrationOrder, ref: VMIRef, link: Link,
                        transfer: Transfer, halt: asyncio.Event) -> Transfer | None:
        """Step the simulated transfer every report interval, on the time that really
        passed, reporting its progress, until it converges or fails, or is halted."""
        last = time.monotonic()
        while transfer.state == "running":
            await pause_unless_stopped(halt, self.agent.cfg.migration_report_seconds)
            if halt.is_set():
                return None  # aborted (the abort reports it), or the agent stops
            now = time.monotonic()
            transfer = advance(link, transfer, now - last)
            last = now
            if ref.domain not in self.agent.domains:
                transfer = msgspec.structs.replace(transfer, state="failed",
                                                   reason=SOURCE_LOST_DOMAIN_REASON)
            if transfer.state == "running":
                await self._observe(order, ref, "progress", transfer)
        return transfer

    async def _hypervisor_transfer(self, order: MigrationOrder, ref: VMIRef,
                                   halt: asyncio.Event) -> Transfer | None:
        """libvirt migrates; halted and still here, the transfer is left unreported (the
        abort reports it, or the next agent); halted too late, it converged."""
        transfer, halted = await livemigration.transfer(
            self.agent.conn, ref.domain, order, interval=self.agent.cfg.migration_report_seconds,
            halt=halt, progress=functools.partial(self._observe, order, ref, "progress"))
        return None if halted and transfer.state == "failed" else transfer

    async def _transfer(self, order: MigrationOrder, ref: VMIRef, run: TransferRun,
                        halt: asyncio.Event) -> None:
        """The transfer until it ends; then converged is recorded before it is said, and a
        failed one is said and forgotten."""
        try:
            transfer = await run(halt)
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
            self.agent.log.warning("migration transfer not reported", vmi=ref.name,
                                   error=describe(e))
        except Exception as e:  # a bug: the agent goes on, the next start fails the transfer
            self.agent.log.error("migration transfer ended", vmi=ref.name, exc_info=e)
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
            self.agent.log.info("migration abort: no such migration here")
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
            self.agent.log.warning("migration failed, yet its guest runs here: kept",
                                   vmi=ref.name, migration=order.uid)
            return
        await self._unprepare(ref)
        await self._forget_incoming(ref.uid)

    async def _guest_here(self, ref: VMIRef) -> bool:
        """The guest runs on this node: adopted, or (a real host) its domain came in."""
        if ref.domain in self.agent.domains:
            return True
        if self.agent.cfg.simulated:
            return False
        return await asyncio.to_thread(livemigration.arrived, self.agent.conn, ref.domain)

    async def _depart(self, ref: VMIRef, order: MigrationOrder) -> None:
        """The VMI runs on the target now: remove this copy without a word (a `gone` report
        from here would speak for a VMI that is no longer this node's), forget it."""
        self.agent.log.info("removing the guest that migrated away", vmi=ref.name,
                            migration=order.uid, target=order.target_node)
        await self.agent._remove(ref)
        await self._forget_outgoing(ref.uid)

    async def _forget_outgoing(self, uid: str) -> None:
        if self.book.outgoing.pop(uid, None) is not None:
            await self._save()

    # -- shared ------------------------------------------------------------------------

    async def _save(self) -> None:
        async with self.saving:
            await self.agent._nats(lambda: self.agent.worklog.record_migrations(self.book),
                                   "recording the migrations")

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
        self.agent.log.info("migration observed", vmi=ref.name, namespace=ref.namespace,
                            migration=order.uid, state=state, reason=reason)
        await self.agent._report(NodeReport(id=random_uuid(), node=self.node,
                                            kind="migration", migration=obs,
                                            correlation_id=correlation_id))



def _ref(command: NodeCommand) -> VMIRef:
    return VMIRef(command.namespace, command.name, command.uid)
