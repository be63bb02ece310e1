"""The one interface the agent drives its host through.

A node's host is a real hypervisor (`nodeagent.libvirthost.LibvirtHost`, `qemu:///system`:
guests with files, a network, a serial console and a guest agent; libvirt migrates them) or
a simulated one (`nodeagent.simhost.SimulatedHost`, libvirt's test driver: guests that run
no code, whose crashes, shutdowns and migrations are simulated). The agent picks one at
start (`nodeagent.agent.host_for`) and never asks which it has: whatever the two do
differently is a method here. What they do alike (define, start, stop, pause a domain, read
its state, discover the host) goes over the libvirt connection both open here (`conn`, with
`nodeagent.lifecycle`).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import libvirt

from events.api.errors import VirtbusError
from nodeagent.guestagent import AgentChange
from nodeagent.migration import Transfer
from nodeagent.phases import Observation
from nodeagent.watcher import LifecycleWatcher, start_event_loop, to_asyncio

if TYPE_CHECKING:
    from nats.aio.client import Client

    from events.api.vm import VirtualMachineInstanceNetworkInterface, VirtualMachineInstanceSpec
    from events.language.messages import MigrationOrder, SimRequest
    from nodeagent.config import AgentConfig
    from nodeagent.converter import ConverterContext
    from nodeagent.converter.context import DomainType
    from nodeagent.vmiref import VMIRef


class SimulationRefused(VirtbusError):
    """Guest simulations exist only on libvirt's test driver; a real guest is never faked."""


TransferRun = Callable[[asyncio.Event], Awaitable[Transfer | None]]
"""A transfer, simulated or real, until it ends (None: halted before it ended)."""


class TransferPlan(NamedTuple):
    """A source's transfer, ready to run."""

    first: Transfer | None
    """What the `running` report says of it: a simulated transfer's first figures; a real
    one has none before libvirt's first statistics."""
    run: TransferRun


ReportInterfaces = Callable[["VMIRef", "list[VirtualMachineInstanceNetworkInterface]"],
                            Awaitable[None]]


class Consoles(Protocol):
    """Where the guests' serial consoles are published while they run (`nodeagent.console`)."""

    async def follow(self, ref: VMIRef) -> None: ...

    async def forget(self, ref: VMIRef) -> None: ...

    async def serve(self, stop: asyncio.Event) -> None: ...


class AgentSwitch(Protocol):
    """What a simulated agent stop and start (`virtbus sim agent-stop|agent-start`) turn."""

    async def switch_off(self) -> None: ...

    async def switch_on(self) -> None: ...


class Host(ABC):
    """A node's host: opened once, then driven through the methods below and `conn`.

    `observations` gets what libvirt says of each guest's lifecycle, `agent_changes` each
    guest agent that connects or disconnects (never on a simulated host: its guests run no
    code)."""

    fallback_cpu_model: str
    """The CPU model its node is labelled with where the driver names none."""
    conn: libvirt.virConnect
    watcher: LifecycleWatcher
    observations: asyncio.Queue[Observation]
    agent_changes: asyncio.Queue[AgentChange]

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg

    @property
    @abstractmethod
    def uri(self) -> str:
        """The libvirt URI to open."""

    @property
    @abstractmethod
    def domain_type(self) -> DomainType:
        """What this host's guests are defined as."""

    async def open(self) -> None:
        """Connect to libvirt and watch its guests' lifecycle."""
        loop = asyncio.get_running_loop()
        start_event_loop()  # before the connection, or a remote one (qemu:///system) reads
        # its events only while some other call of ours is on the wire
        self.conn = await asyncio.to_thread(libvirt.open, self.uri)
        self.observations = asyncio.Queue()
        self.watcher = LifecycleWatcher(self.conn, to_asyncio(loop, self.observations),
                                        node=self.cfg.node)
        self.agent_changes = asyncio.Queue()

    async def close(self) -> None:
        self.watcher.close()
        await asyncio.to_thread(self.conn.close)

    @abstractmethod
    def use_emulation(self, emulate: bool) -> None:
        """Follow the cluster's KubeVirt `developerConfiguration.useEmulation`
        (`nodeagent.hypervisor`)."""

    @abstractmethod
    def consoles(self, nc: Client) -> Consoles:
        """Its guests' consoles, published on `nc`."""

    @abstractmethod
    async def resume(self, live: set[str]) -> None:
        """At start: keep what the VMI instances (uids) still here use, remove the rest."""

    @abstractmethod
    async def watch_interfaces(self, stop: asyncio.Event, guests: Callable[[], Iterable[VMIRef]],
                               report: ReportInterfaces) -> None:
        """Report the guests' interfaces as they change, until `stop`."""

    @abstractmethod
    def guest_context(self, ref: VMIRef, spec: VirtualMachineInstanceSpec,
                      ctx: ConverterContext) -> ConverterContext:
        """`ctx` with what a guest of this host has in its domain (a serial log, its taps)."""

    @abstractmethod
    async def make_files(self, spec: VirtualMachineInstanceSpec, ctx: ConverterContext) -> None:
        """The files a guest opens (`nodeagent.guestdisks`), before its domain is defined."""

    @abstractmethod
    async def attach(self, ref: VMIRef, spec: VirtualMachineInstanceSpec) -> None:
        """A guest's network, before its domain starts (or a migrating one comes in)."""

    @abstractmethod
    async def release(self, ref: VMIRef) -> None:
        """Remove the files and network `make_files` and `attach` made for `ref`."""

    @abstractmethod
    async def agent_connected(self, dom: libvirt.virDomain) -> bool | None:
        """Whether the guest agent of a running guest found at start is connected; None:
        the host cannot say."""

    @abstractmethod
    async def save(self) -> None:
        """Keep the host as it is now, before anyone hears of a change."""

    @abstractmethod
    async def simulate(self, request: SimRequest, agent: AgentSwitch) -> None:
        """Make a `virtbus sim` action happen; `SimulationRefused` where nothing is
        simulated."""

    @abstractmethod
    def migration_address(self) -> str:
        """Where this host takes migrations in ('' where nothing listens)."""

    @abstractmethod
    def plan_transfer(self, order: MigrationOrder, vmi: dict[str, Any], ref: VMIRef, *,
                      progress: Callable[[Transfer], Awaitable[None]],
                      still_here: Callable[[], bool]) -> TransferPlan:
        """The source's transfer of `ref`'s guest, reporting `progress`; a `VirtbusError`
        (its reason) when it cannot start."""

    @abstractmethod
    async def migrated_away(self, domain: str) -> bool:
        """After an agent restart: whether the transfer the last agent started took the guest
        away (once libvirt has settled it)."""

    @abstractmethod
    async def arrived(self, domain: str) -> bool:
        """On a target: whether the migrating guest runs here already."""
