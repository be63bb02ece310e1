"""A real hypervisor host (`qemu:///system`): QEMU guests with the files they open, their
network, serial console and guest agent, under KVM where the probe finds it runs guests
(`nodeagent.hypervisor`), migrated by libvirt (`nodeagent.livemigration`)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import libvirt
import msgspec

from events.api.errors import VirtbusError
from events.language.subjects import Layout
from nodeagent import guestdisks, livemigration
from nodeagent.console import ConsolePublisher
from nodeagent.converter import defaults as converter_defaults
from nodeagent.defaults import TEST_DRIVER_SCHEME
from nodeagent.guestagent import GuestAgentWatcher, agent_connected
from nodeagent.host import (
    AgentSwitch,
    Consoles,
    Host,
    ReportInterfaces,
    SimulationRefused,
    TransferPlan,
)
from nodeagent.hypervisor import Hypervisor, guest_owner, kvm_runs_guests
from nodeagent.imagestore import ImageStore
from nodeagent.network.node import NodeNetwork, host_interfaces, parse_subnet

if TYPE_CHECKING:
    from nats.aio.client import Client

    from events.api.vm import VirtualMachineInstanceSpec
    from events.language.messages import MigrationOrder, SimRequest
    from nodeagent.config import AgentConfig
    from nodeagent.converter import ConverterContext
    from nodeagent.converter.context import DomainType
    from nodeagent.migration import Transfer
    from nodeagent.vmiref import VMIRef


class LibvirtHost(Host):
    fallback_cpu_model = ""
    """libvirt names a real host's CPU."""
    hypervisor: Hypervisor
    capabilities: str
    guest_agents: GuestAgentWatcher

    def __init__(self, cfg: AgentConfig) -> None:
        super().__init__(cfg)
        self.images = ImageStore(cfg.image_dir)
        self.network = NodeNetwork(cfg.bridge, parse_subnet(cfg.pod_subnet), cfg.network_dir)

    @property
    def uri(self) -> str:
        return self.cfg.libvirt_uri

    @property
    def domain_type(self) -> DomainType:
        return self.hypervisor.domain_type

    async def open(self) -> None:
        """Also: watch the guest agents, and find whether KVM runs guests here."""
        await super().open()
        loop = asyncio.get_running_loop()
        self.guest_agents = GuestAgentWatcher(
            self.conn, lambda change: loop.call_soon_threadsafe(self.agent_changes.put_nowait,
                                                                change))
        self.capabilities = await asyncio.to_thread(self.conn.getCapabilities)
        kvm = await asyncio.to_thread(kvm_runs_guests, self.capabilities, self.cfg.hypervisor,
                                      self.cfg.hypervisor_probe_seconds, node=self.cfg.node)
        self.hypervisor = Hypervisor(kvm)

    async def close(self) -> None:
        self.guest_agents.close()
        await super().close()

    def use_emulation(self, emulate: bool) -> None:
        self.hypervisor = dataclasses.replace(self.hypervisor, use_emulation=emulate)

    def consoles(self, nc: Client) -> Consoles:
        return ConsolePublisher(nc, Layout(self.cfg.prefix), self.cfg.node,
                                converter_defaults.RUN_DIR)

    async def resume(self, live: set[str]) -> None:
        """The network of the guests still here (and those prepared to come) is kept."""
        await asyncio.to_thread(self.network.start, live)

    async def watch_interfaces(self, stop: asyncio.Event, guests: Callable[[], Iterable[VMIRef]],
                               report: ReportInterfaces) -> None:
        await self.network.watch(stop, guests, report)

    def guest_context(self, ref: VMIRef, spec: VirtualMachineInstanceSpec,
                      ctx: ConverterContext) -> ConverterContext:
        return msgspec.structs.replace(ctx, serial_log=True,
                                       host_interfaces=host_interfaces(ref.uid, spec))

    async def make_files(self, spec: VirtualMachineInstanceSpec, ctx: ConverterContext) -> None:
        await asyncio.to_thread(guestdisks.prepare, spec, ctx, self.images,
                                guest_owner(self.capabilities, self.domain_type))

    async def attach(self, ref: VMIRef, spec: VirtualMachineInstanceSpec) -> None:
        await asyncio.to_thread(self.network.attach, ref, spec)

    async def release(self, ref: VMIRef) -> None:
        await asyncio.to_thread(guestdisks.remove, self.cfg.disk_dir, converter_defaults.RUN_DIR,
                                ref.namespace, ref.name, ref.uid)
        await asyncio.to_thread(self.network.detach, ref.uid)

    async def agent_connected(self, dom: libvirt.virDomain) -> bool | None:
        return await asyncio.to_thread(agent_connected, dom)

    async def save(self) -> None:
        """libvirtd keeps its guests itself."""

    async def simulate(self, request: SimRequest, agent: AgentSwitch) -> None:
        raise SimulationRefused(
            f"guest simulation needs a {TEST_DRIVER_SCHEME} connection, not "
            f"{self.cfg.libvirt_uri!r}; real guests shut down or crash on their own")

    def migration_address(self) -> str:
        return self.cfg.migration_address or socket.gethostname()

    def plan_transfer(self, order: MigrationOrder, vmi: dict[str, Any], ref: VMIRef, *,
                      progress: Callable[[Transfer], Awaitable[None]],
                      still_here: Callable[[], bool]) -> TransferPlan:
        """libvirt migrates the guest to the address the target reported."""
        if not order.target_address:
            raise VirtbusError(livemigration.NO_ADDRESS_REASON)
        return TransferPlan(None, functools.partial(self._transfer, order, ref, progress))

    async def _transfer(self, order: MigrationOrder, ref: VMIRef,
                        progress: Callable[[Transfer], Awaitable[None]],
                        halt: asyncio.Event) -> Transfer | None:
        """Halted and still here, the transfer is left unreported (the abort reports it, or
        the next agent); halted too late, it converged."""
        transfer, halted = await livemigration.transfer(
            self.conn, ref.domain, order, interval=self.cfg.migration_report_seconds,
            halt=halt, progress=progress)
        return None if halted and transfer.state == "failed" else transfer

    async def migrated_away(self, domain: str) -> bool:
        return await asyncio.to_thread(livemigration.settle, self.conn, domain)

    async def arrived(self, domain: str) -> bool:
        return await asyncio.to_thread(livemigration.arrived, self.conn, domain)
