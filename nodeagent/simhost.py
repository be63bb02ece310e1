"""A simulated host: libvirt's test driver (`test:///default`, or a host of its own in a file).

Its guests run no code: they open no files, have no network, console or guest agent, and
stop, crash or fail a disk only when `virtbus sim` says so (`simulate`; the test driver can
only destroy or suspend, so the `LifecycleWatcher` is told what the stop or pause means).
Its domains are of type `test`, and its node is labelled with `TEST_HOST_CPU_MODEL`, as the
test driver names no CPU.

The test driver cannot migrate, so a source steps a simulated transfer (`nodeagent.migration`)
from the guest's memory (`memory.guest`, else its memory request), the link (the agent's
`sim_migration_bandwidth`, or the migration's bandwidth when lower) and the guest's dirty
rate (its VMI's `virtbus.io/simulated-dirty-rate`, else the agent's `sim_dirty_rate`).

The host lives in the agent's process (`HostInMemory`), or in a `--sim-state` file that
outlives the agent (`nodeagent.hostfile`), saved after each change the agent makes or
reports and before it reports or acknowledges it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import libvirt
import msgspec
import structlog

from events.api.errors import VirtbusError
from events.api.resources import guest_memory_bytes, quantity
from events.language.messages import SIMULATED_DIRTY_RATE_ANNOTATION
from events.runtime.aio import pause_unless_stopped
from nodeagent.converter.context import domain_name
from nodeagent.defaults import TEST_HOST_CPU_MODEL
from nodeagent.domxml import parse_manifest
from nodeagent.host import AgentSwitch, Consoles, Host, ReportInterfaces, TransferPlan
from nodeagent.lifecycle import require
from nodeagent.migration import SOURCE_LOST_DOMAIN_REASON, Link, Transfer, advance, begin
from nodeagent.phases import StopCause

if TYPE_CHECKING:
    from nats.aio.client import Client

    from events.api.vm import VirtualMachineInstanceSpec
    from events.language.messages import MigrationOrder, SimRequest
    from nodeagent.config import AgentConfig
    from nodeagent.converter import ConverterContext
    from nodeagent.converter.context import DomainType
    from nodeagent.vmiref import VMIRef
    from nodeagent.watcher import LifecycleWatcher

log = structlog.get_logger(__name__)


class HostKeeping(Protocol):
    """Where a simulated host is kept between an agent's changes."""

    @property
    def uri(self) -> str: ...

    async def keep(self, conn: libvirt.virConnect) -> None: ...


class HostInMemory:
    """The test driver's host as libvirt keeps it: in the process, gone with it."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    async def keep(self, conn: libvirt.virConnect) -> None:
        """Nothing to write: the host is the process's."""


class NoConsoles:
    """A simulated guest writes nothing on its console: there is nothing to publish."""

    async def follow(self, ref: VMIRef) -> None:
        pass

    async def forget(self, ref: VMIRef) -> None:
        pass

    async def serve(self, stop: asyncio.Event) -> None:
        pass


class SimulatedHost(Host):
    fallback_cpu_model = TEST_HOST_CPU_MODEL

    def __init__(self, cfg: AgentConfig, keeping: HostKeeping) -> None:
        super().__init__(cfg)
        self.keeping = keeping

    @property
    def uri(self) -> str:
        return self.keeping.uri

    @property
    def domain_type(self) -> DomainType:
        return "test"

    def use_emulation(self, emulate: bool) -> None:
        """A test domain is neither KVM's nor QEMU's."""

    def consoles(self, nc: Client) -> Consoles:
        return NoConsoles()

    async def resume(self, live: set[str]) -> None:
        """Nothing here but the domains."""

    async def watch_interfaces(self, stop: asyncio.Event, guests: Callable[[], Iterable[VMIRef]],
                               report: ReportInterfaces) -> None:
        """A simulated guest has no interfaces to watch."""

    def guest_context(self, ref: VMIRef, spec: VirtualMachineInstanceSpec,
                      ctx: ConverterContext) -> ConverterContext:
        """As converted: no serial log, no taps."""
        return ctx

    async def make_files(self, spec: VirtualMachineInstanceSpec, ctx: ConverterContext) -> None:
        """A simulated guest opens none."""

    async def attach(self, ref: VMIRef, spec: VirtualMachineInstanceSpec) -> None:
        """A simulated guest has no network."""

    async def release(self, ref: VMIRef) -> None:
        """Nothing was made."""

    async def agent_connected(self, dom: libvirt.virDomain) -> bool | None:
        return None

    async def save(self) -> None:
        await self.keeping.keep(self.conn)

    async def simulate(self, request: SimRequest, agent: AgentSwitch) -> None:
        domain = domain_name(request.namespace, request.name)
        match request.action:
            case "guest-shutdown":
                await asyncio.to_thread(simulate_guest_shutdown, self.conn, domain, self.watcher)
            case "guest-crash":
                await asyncio.to_thread(simulate_guest_crash, self.conn, domain, self.watcher)
            case "guest-io-error":
                await asyncio.to_thread(simulate_guest_io_error, self.conn, domain, self.watcher)
            case "agent-stop":
                await agent.switch_off()
            case "agent-start":
                await agent.switch_on()

    def migration_address(self) -> str:
        """Nothing listens: the transfer is simulated on the source."""
        return ""

    def plan_transfer(self, order: MigrationOrder, vmi: dict[str, Any], ref: VMIRef, *,
                      progress: Callable[[Transfer], Awaitable[None]],
                      still_here: Callable[[], bool]) -> TransferPlan:
        link = self._link(vmi, order)
        first = begin(link)
        return TransferPlan(first, functools.partial(self._transfer, link, first, progress,
                                                     still_here))

    def _link(self, vmi: dict[str, Any], order: MigrationOrder) -> Link:
        """The simulated transfer's guest, link and limits (module docstring)."""
        spec, _ = parse_manifest(vmi, domain_type=self.domain_type, disk_dir=self.cfg.disk_dir)
        annotations = (vmi.get("metadata") or {}).get("annotations") or {}
        dirty_rate = self.cfg.sim_dirty_rate
        if SIMULATED_DIRTY_RATE_ANNOTATION in annotations:
            given = annotations[SIMULATED_DIRTY_RATE_ANNOTATION]
            try:
                dirty_rate = int(quantity(given))
            except (ValueError, TypeError, ArithmeticError):
                raise VirtbusError(f"annotation {SIMULATED_DIRTY_RATE_ANNOTATION}: not a "
                                   f"quantity per second: {given!r}") from None
        bandwidth = self.cfg.sim_migration_bandwidth
        if order.bandwidth_bytes_per_second:
            bandwidth = min(bandwidth, order.bandwidth_bytes_per_second)
        return Link(memory=guest_memory_bytes(spec.domain), bandwidth=bandwidth,
                    dirty_rate=max(dirty_rate, 0),
                    progress_timeout=order.progress_timeout_seconds,
                    completion_timeout=order.completion_timeout_seconds,
                    allow_post_copy=order.allow_post_copy,
                    allow_auto_converge=order.allow_auto_converge)

    async def _transfer(self, link: Link, transfer: Transfer,
                        progress: Callable[[Transfer], Awaitable[None]],
                        still_here: Callable[[], bool], halt: asyncio.Event) -> Transfer | None:
        """Step the transfer every report interval, on the time that really passed,
        reporting its progress, until it converges or fails, or is halted."""
        last = time.monotonic()
        while transfer.state == "running":
            await pause_unless_stopped(halt, self.cfg.migration_report_seconds)
            if halt.is_set():
                return None  # aborted (the abort reports it), or the agent stops
            now = time.monotonic()
            transfer = advance(link, transfer, now - last)
            last = now
            if not still_here():
                transfer = msgspec.structs.replace(transfer, state="failed",
                                                   reason=SOURCE_LOST_DOMAIN_REASON)
            if transfer.state == "running":
                await progress(transfer)
        return transfer

    async def migrated_away(self, domain: str) -> bool:
        """A simulated transfer ends with the agent that ran it: the guest never left."""
        return False

    async def arrived(self, domain: str) -> bool:
        """A simulated guest comes in only when its migration's finish starts it."""
        return False


def simulate_guest_shutdown(conn: libvirt.virConnect, name: str,
                            watcher: LifecycleWatcher) -> None:
    """The guest powers itself off: Succeeded, observed with cause "guest shutdown"."""
    _simulate(conn, name, watcher, StopCause.GUEST_SHUTDOWN, lambda dom: dom.shutdown())


def simulate_guest_crash(conn: libvirt.virConnect, name: str, watcher: LifecycleWatcher) -> None:
    """The guest crashes: the test driver can only destroy, so the cause says it crashed."""
    _simulate(conn, name, watcher, StopCause.GUEST_CRASH, lambda dom: dom.destroy())


def simulate_guest_io_error(conn: libvirt.virConnect, name: str,
                            watcher: LifecycleWatcher) -> None:
    """A disk I/O error pauses the guest (a disk's `error_policy` of stop, libvirt's and
    KubeVirt's default): the test driver can only suspend, so the cause says why."""
    _simulate(conn, name, watcher, StopCause.IO_ERROR, lambda dom: dom.suspend())


def _simulate(conn: libvirt.virConnect, name: str, watcher: LifecycleWatcher, cause: StopCause,
              act: Callable[[libvirt.virDomain], object]) -> None:
    dom = require(conn, name)
    watcher.expect(name, cause)
    try:
        act(dom)
    except libvirt.libvirtError:
        watcher.forget(name)
        raise
    log.info("simulated", domain=name, cause=cause)
