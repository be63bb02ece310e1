"""The node agent: its node's commands in, libvirt driven, observations out.

It never writes events. It reports what it sees (its host, each guest's phase) and the
control plane decides what that means. Work comes from the node's work-queue consumer and is
acknowledged only after it is done and reported; launching is idempotent by domain name, so
a redelivery after a crash finds the guest already running and launches nothing twice.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
import xml.etree.ElementTree as ET

import libvirt
import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from events.aio import ACK_WAIT_SECONDS, claimed, pause_unless_stopped
from events.api.resources import vmi_resources
from events.api.vm import VirtualMachineInstanceSpec
from events.connect import connect
from events.errors import InvalidSpec, VirtbusError
from events.messages import (
    DomainObservation,
    DomainSummary,
    NodeCommand,
    NodeReport,
    SimReply,
    SimRequest,
)
from events.streams import HEARTBEAT_INTERVAL, wait_for_streams
from events.subjects import Layout, encode_token
from nodeagent import lifecycle
from nodeagent.converter.context import hypervisor_domain_type
from nodeagent.converter.identity import VMI_METADATA_TAG
from nodeagent.devices import DeviceLedger
from nodeagent.discovery import DiscoveryConfig, discover_host
from nodeagent.domxml import render_manifest
from nodeagent.phases import GuestPhase, Observation, phase_for
from nodeagent.virterror import quiet_libvirt_errors
from nodeagent.watcher import LifecycleWatcher, to_asyncio

log = structlog.get_logger(__name__)

FETCH_BATCH = 16


class VMIRef(msgspec.Struct, frozen=True):
    namespace: str
    name: str
    uid: str

    @property
    def domain(self) -> str:
        return f"{self.namespace}_{self.name}"


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    nats_url: str
    prefix: str = "virtbus"
    libvirt_uri: str = "test:///default"
    kvm_devices: int = 110
    tun_devices: int = 110
    host_cpu_model: str = ""
    disk_dir: str = "/var/lib/virtbus/disks"


def vmi_of(dom: libvirt.virDomain) -> VMIRef | None:
    """The VMI a domain belongs to, from the metadata the converter writes."""
    found = ET.fromstring(dom.XMLDesc(0)).find(f"metadata/{VMI_METADATA_TAG}")
    if found is None:
        return None
    return VMIRef(found.get("namespace", ""), found.get("name", ""), found.get("uid", ""))


class NodeAgent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.layout = Layout(cfg.prefix)
        self.log = log.bind(node=cfg.node)
        self.domains: dict[str, VMIRef] = {}
        self.silenced = asyncio.Event()
        self.nc: Client | None = None

    # -- start-up ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        quiet_libvirt_errors()
        loop = asyncio.get_running_loop()
        self.conn = await asyncio.to_thread(libvirt.open, self.cfg.libvirt_uri)
        observations: asyncio.Queue[Observation] = asyncio.Queue()
        self.watcher = LifecycleWatcher(self.conn, to_asyncio(loop, observations),
                                        node=self.cfg.node)
        self.domain_type = hypervisor_domain_type(self.cfg.libvirt_uri)
        self.nc = await connect(self.cfg.nats_url, f"agent-{self.cfg.node}")
        try:
            await wait_for_streams(self.nc.jetstream(), self.layout)
            await self._adopt_domains()
            await self.report_host()
            sim = await self.nc.subscribe(self.layout.agent_subject(self.cfg.node, "sim"),
                                          cb=self._on_sim)
            self.log.info("agent started", libvirt_uri=self.cfg.libvirt_uri,
                          domains=len(self.domains))
            await asyncio.gather(self._heartbeat(stop), self._consume(stop),
                                 self._pump(observations, stop))
            await sim.unsubscribe()
        finally:
            self.watcher.close()
            await self.nc.close()
            await asyncio.to_thread(self.conn.close)

    async def _adopt_domains(self) -> None:
        """After a restart: find our guests, rebuild the device ledger, report their phase."""
        for dom in await asyncio.to_thread(self.conn.listAllDomains, 0):
            ref = vmi_of(dom)
            if ref is None:
                continue
            self.domains[ref.domain] = ref
            state, reason = dom.state()
            phase = phase_for(state, reason)
            if phase is not None:
                await self.report_domain(ref, phase, "found at agent start")
        capacity = DiscoveryConfig(node_name=self.cfg.node, kvm_devices=self.cfg.kvm_devices,
                                   tun_devices=self.cfg.tun_devices).device_capacity()
        self.ledger = DeviceLedger.rebuild(capacity, [r.uid for r in self.domains.values()],
                                           node=self.cfg.node)

    # -- reports -----------------------------------------------------------------------

    async def _report(self, report: NodeReport) -> None:
        if self.silenced.is_set() or self.nc is None:
            return
        subject = self.layout.report_subject(self.cfg.node, report.kind)
        await self.nc.jetstream().publish(subject, msgspec.msgpack.encode(report),
                                          headers={"Nats-Msg-Id": report.id})

    async def report_host(self) -> None:
        cfg = DiscoveryConfig(node_name=self.cfg.node, kvm_devices=self.cfg.kvm_devices,
                              tun_devices=self.cfg.tun_devices,
                              host_cpu_model=self.cfg.host_cpu_model)
        info = await asyncio.to_thread(discover_host, self.conn, cfg)
        info = msgspec.structs.replace(info, hostname=socket.gethostname())
        await self._report(NodeReport(id=str(uuid.uuid4()), node=self.cfg.node, kind="node",
                                      info=msgspec.to_builtins(info)))

    async def report_domain(self, ref: VMIRef, phase: str, reason: str = "",
                            gone: bool = False) -> None:
        obs = DomainObservation(namespace=ref.namespace, name=ref.name, uid=ref.uid,
                                phase=phase, reason=reason, gone=gone)
        self.log.info("observed", vmi=ref.name, namespace=ref.namespace, phase=phase,
                      gone=gone, reason=reason)
        await self._report(NodeReport(id=str(uuid.uuid4()), node=self.cfg.node, kind="domain",
                                      domain=obs))

    # -- loops -------------------------------------------------------------------------

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        assert self.nc is not None
        kv = await self.nc.jetstream().key_value(self.layout.heartbeats_bucket)
        key = encode_token(self.cfg.node)
        while not stop.is_set():
            if not self.silenced.is_set():
                await kv.put(key, str(time.time()).encode())
            await pause_unless_stopped(stop, HEARTBEAT_INTERVAL)

    async def _consume(self, stop: asyncio.Event) -> None:
        assert self.nc is not None
        durable = f"agent-{encode_token(self.cfg.node)}"
        sub = await self.nc.jetstream().pull_subscribe(
            self.layout.node_filter(self.cfg.node), durable=durable,
            stream=self.layout.node_stream,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_SECONDS))
        while not stop.is_set():
            if self.silenced.is_set():
                await asyncio.sleep(0.2)  # a silenced agent does nothing; poll for resume
                continue
            try:
                msgs = await sub.fetch(FETCH_BATCH, timeout=1.0)
            except TimeoutError:
                continue
            for msg in msgs:
                await self._handle(msg)

    async def _handle(self, msg: Msg) -> None:
        command = msgspec.msgpack.decode(msg.data, type=NodeCommand)
        ref = VMIRef(command.namespace, command.name, command.uid)
        bound = self.log.bind(vmi=ref.name, namespace=ref.namespace, verb=command.verb,
                              event_id=command.event_id)
        try:
            async with claimed(msg):
                await self.execute(command, ref)
        except (VirtbusError, libvirt.libvirtError) as e:
            bound.warning("node command failed", error=str(e))
            if command.verb == "launch":
                await self.report_domain(ref, "Failed", f"launch failed: {e}")
        await msg.ack()

    async def execute(self, command: NodeCommand, ref: VMIRef) -> None:
        match command.verb:
            case "launch":
                await self._launch(command, ref)
            case "stop":
                await asyncio.to_thread(lifecycle.graceful_stop, self.conn, ref.domain,
                                        command.grace_period_seconds, self.watcher)
                self.ledger.release(ref.uid)
                self.domains.pop(ref.domain, None)
                await self.report_domain(ref, "Succeeded", "stopped on request", gone=True)
            case "pause":
                await asyncio.to_thread(lifecycle.pause, self.conn, ref.domain)
            case "unpause":
                await asyncio.to_thread(lifecycle.unpause, self.conn, ref.domain)
            case "restart":
                await asyncio.to_thread(lifecycle.restart, self.conn, ref.domain, self.watcher)

    async def _launch(self, command: NodeCommand, ref: VMIRef) -> None:
        if command.vmi is None:
            raise InvalidSpec("vmi", "a launch needs the VMI")
        xml = render_manifest(command.vmi, domain_type=self.domain_type,
                              disk_dir=self.cfg.disk_dir)
        spec = msgspec.convert(command.vmi["spec"], VirtualMachineInstanceSpec)
        demand = vmi_resources(spec.domain, emulation=self.domain_type != "kvm").extended
        self.ledger.acquire(ref.uid, {k: v for k, v in demand.items()
                                      if k in self.ledger.available()})
        self.domains[ref.domain] = ref
        await asyncio.to_thread(lifecycle.define_and_start, self.conn, xml)
        await self.report_domain(ref, "Running", "launched")

    async def _pump(self, observations: asyncio.Queue[Observation], stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                obs = await asyncio.wait_for(observations.get(), 1.0)
            except TimeoutError:
                continue
            ref = self.domains.get(obs.name)
            phase = obs.phase
            if ref is None or phase is None:
                continue
            if phase is not GuestPhase.RUNNING:
                self.ledger.release(ref.uid)
            await self.report_domain(ref, str(phase), str(obs.cause or ""))

    # -- simulation --------------------------------------------------------------------

    async def _on_sim(self, msg: Msg) -> None:
        try:
            request = msgspec.msgpack.decode(msg.data, type=SimRequest)
            if request.action == "domains":
                reply = SimReply(ok=True, domains=await asyncio.to_thread(self.summaries))
            else:
                await self.simulate(request)
                reply = SimReply(ok=True)
        except (VirtbusError, libvirt.libvirtError, msgspec.DecodeError) as e:
            reply = SimReply(ok=False, error=str(e))
        await msg.respond(msgspec.msgpack.encode(reply))

    def summaries(self) -> list[DomainSummary]:
        """The host's guests that belong to VMIs, as libvirt reports them now."""
        out = []
        for dom in self.conn.listAllDomains(0):
            ref = vmi_of(dom)
            if ref is not None:
                out.append(DomainSummary(name=dom.name(), uid=ref.uid, state=dom.state()[0]))
        return out

    async def simulate(self, request: SimRequest) -> None:
        lifecycle.ensure_test_uri(self.cfg.libvirt_uri)
        domain = f"{request.namespace}_{request.name}"
        match request.action:
            case "guest-shutdown":
                await asyncio.to_thread(lifecycle.simulate_guest_shutdown, self.conn, domain,
                                        self.watcher)
            case "guest-crash":
                await asyncio.to_thread(lifecycle.simulate_guest_crash, self.conn, domain,
                                        self.watcher)
            case "agent-stop":
                self.log.warning("simulated agent stop: no heartbeats, reports or work")
                self.silenced.set()
            case "agent-start":
                self.silenced.clear()
                await self.report_host()
