"""The node agent: its node's commands in, its host driven, observations out.

It never writes events. It reports what it sees (its host, each guest's phase) and the
control plane decides what that means. `NodeAgent` picks the node's host once, at start
(`host_for`: a real hypervisor or a simulated one, `nodeagent.host`), and composes the units
that do the work:

- `nodeagent.consumer`: the node's work queue, one item at a time, each applied once;
- `nodeagent.guests`: the guests, launched, stopped, paused, removed, their devices held;
- `nodeagent.reconciler`: the domains against what the cluster placed here, and what
  libvirt says of them;
- `nodeagent.reporter`: the reports (host, guests, interfaces);
- `nodeagent.heartbeat`: the heartbeat;
- `nodeagent.migrating`: live migration's verbs, and what a restart makes of a migration.

Node work is idempotent here, not only inside the node stream's duplicate window: each item
is looked up by its event id in the agent's work log (`nodeagent.worklog`, a KV bucket that
outlives the agent and every window), and a launch by its VMI's uid, which the log marks
finished before the agent reports it Succeeded or Failed or removes its domain as no active
VMI's. An item applied already is only acknowledged; a launch of a finished VMI defines
nothing. The crash windows, in the order the work goes:

- done, not yet reported or recorded: the item is delivered again and done again. Launch,
  stop, pause and unpause find libvirt as they left it and change nothing; a restart
  (reboot) reboots the guest a second time, the one repeat a guest can see.
- reported, not yet recorded: the same, and its report is made twice (the same observation).
- recorded, not yet acknowledged: delivered again, found applied, acknowledged, nothing done.
- a VMI marked finished, not yet reported: the restarted agent finds it placed here, Running
  and without a domain, and reports it gone (the reconcile); it stays finished.
- an orphan marked finished, its domain not yet removed: the next reconcile removes it.

Nothing read from the wire stops the agent, nor does a NATS failover: what NATS fails for a
moment (a timeout, no responders, a 503, a leader being elected:
`events.jetstream.transient`) is tried again where it failed, one log line per attempt, in
every start-up query, report, record, pull and heartbeat.

At start (and when a simulated agent stop ends) it reconciles as virt-handler does.

A simulated host may be kept in a file (`sim_state`, `nodeagent.hostfile`), saved after each
change the agent makes or reports and before it reports or acknowledges it, so what the
cluster heard of is on file. A kill between a libvirt change and its save loses that change
from the file: the next agent finds the host as it was, the cluster never heard of the
change, and the unacknowledged command that made it is redelivered (every command is
idempotent); a simulated guest action (crash, shutdown, I/O error) that was not yet reported
did not happen.
"""

from __future__ import annotations

import asyncio

import libvirt
import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from events.api.errors import VirtbusError
from events.api.resources import load_quantity_parser
from events.jetstream.connect import connect
from events.jetstream.streams import wait_for_streams
from events.jetstream.transient import describe
from events.language.messages import SimReply, SimRequest
from events.language.subjects import Layout
from events.runtime.aio import together, unless_stopped
from nodeagent.config import AgentConfig
from nodeagent.consumer import WorkConsumer
from nodeagent.defaults import TEST_DEFAULT_URI, TEST_DRIVER_SCHEME
from nodeagent.discovery import DiscoveryConfig
from nodeagent.guests import Guests
from nodeagent.heartbeat import beat
from nodeagent.host import Host, SimulationRefused
from nodeagent.hostfile import HostFile
from nodeagent.libvirthost import LibvirtHost
from nodeagent.migrating import Migrations
from nodeagent.readservice import ReadService
from nodeagent.reconciler import Reconciler
from nodeagent.reporter import Reporter
from nodeagent.simhost import HostInMemory, SimulatedHost
from nodeagent.virterror import quiet_libvirt_errors
from nodeagent.worklog import WorkLog, open_worklog

log = structlog.get_logger(__name__)


def host_for(cfg: AgentConfig) -> Host:
    """The node's host, by its libvirt URI: the one place the agent tells a simulated host
    (libvirt's test driver; with `sim_state`, test:///default kept in a file) from a real
    one."""
    if cfg.sim_state:
        if cfg.libvirt_uri != TEST_DEFAULT_URI:
            raise SimulationRefused(
                f"--sim-state keeps a simulated host in a file and needs --libvirt-uri "
                f"{TEST_DEFAULT_URI}, not {cfg.libvirt_uri!r}")
        return SimulatedHost(cfg, HostFile(cfg.sim_state))
    if cfg.libvirt_uri.startswith(TEST_DRIVER_SCHEME):
        return SimulatedHost(cfg, HostInMemory(cfg.libvirt_uri))
    return LibvirtHost(cfg)


class NodeAgent:
    """One node's agent (see the module); `run` it once."""

    # the units, composed once the agent is connected (`run`)
    worklog: WorkLog
    reporter: Reporter
    guests: Guests
    migrations: Migrations
    reconciler: Reconciler
    work: WorkConsumer

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.layout = Layout(cfg.prefix)
        self.log = log.bind(node=cfg.node)
        self.host = host_for(cfg)
        self.active = asyncio.Event()
        """Cleared while a simulated agent stop lasts: no heartbeats, reports or work."""
        self.active.set()
        self.started = asyncio.Event()
        """Set once the agent has reconciled and takes work."""
        self.busy = asyncio.Lock()
        """Held while a node command runs or the agent reconciles, so neither sees the
        other half done."""

    async def run(self, stop: asyncio.Event, nc: Client | None = None) -> None:
        """Serve until `stop`; on `nc` when given (a fleet's one connection, left open),
        else on a connection of its own."""
        quiet_libvirt_errors()
        load_quantity_parser()  # now, not on the loop of the first launch, beside heartbeats
        await self.host.open()
        connection = nc or await connect(self.cfg.access, f"agent-{self.cfg.node}")
        try:
            js = connection.jetstream()
            if not await unless_stopped(wait_for_streams(js, self.layout), stop):
                return
            opened = asyncio.ensure_future(open_worklog(js, self.layout, self.cfg.node, stop))
            if not await unless_stopped(opened, stop):
                return
            self._compose(connection, opened.result(), stop)
            await self._serve(connection, stop)
        finally:
            await self.host.close()
            if nc is None:
                await connection.close()

    def _compose(self, nc: Client, worklog: WorkLog, stop: asyncio.Event) -> None:
        """The units of a running agent, on its connection and work log."""
        cfg = self.cfg
        self.worklog = worklog
        reads = ReadService(nc, self.layout, cfg.node, cfg.read_service_wait_seconds)
        discovery = DiscoveryConfig(
            node_name=cfg.node, kvm_devices=cfg.kvm_devices, tun_devices=cfg.tun_devices,
            host_cpu_model=cfg.host_cpu_model or self.host.fallback_cpu_model,
            agent_version=cfg.agent_version, cpus=cfg.sim_cpus, memory_bytes=cfg.sim_memory)
        self.reporter = Reporter(nc, self.layout, self.host, worklog, reads,
                                 discovery=discovery, active=self.active, stop=stop)
        self.guests = Guests(self.host, self.host.consoles(nc), self.reporter, worklog,
                             installation=cfg.prefix, disk_dir=cfg.disk_dir,
                             capacity=discovery.device_capacity())
        self.migrations = Migrations(self.guests)
        self.reconciler = Reconciler(self.host, self.guests, self.reporter, reads,
                                     self.migrations, worklog=worklog, busy=self.busy)
        self.work = WorkConsumer(nc, self.layout, self.guests, self.migrations, worklog,
                                 busy=self.busy, active=self.active)

    async def _serve(self, nc: Client, stop: asyncio.Event) -> None:
        """Start (adopt, resume, report, reconcile), then work until `stop`."""
        await self.reconciler.adopt()
        await self.migrations.resume()
        # kept: the running guests' network and the prepared ones'
        await self.host.resume(self.guests.uids() | set(self.migrations.book.incoming))
        await self.reporter.report_host(force=True)
        sim = await nc.subscribe(self.layout.agent_subject(self.cfg.node, "sim"),
                                 cb=self._on_sim)
        heartbeat = asyncio.ensure_future(beat(nc, self.layout, self.cfg.node,
                                               active=self.active, stop=stop))
        if await unless_stopped(self.reconciler.reconcile(), stop):
            self.log.info("agent started", libvirt_uri=self.cfg.libvirt_uri,
                          domains=len(self.guests.domains))
            self.started.set()
            await together(
                self.work.run(stop), self.reconciler.watch_lifecycle(stop),
                self.reporter.rediscover(stop, self.cfg.rediscovery_seconds),
                self.guests.refresh_metrics(stop, self.cfg.downward_metrics_seconds, self.active),
                self.migrations.serve(stop), self.guests.consoles.serve(stop),
                self.reconciler.watch_guest_agents(stop),
                self.host.watch_interfaces(stop, self.guests.domains.values,
                                           self.reporter.report_interfaces))
        await heartbeat
        await sim.unsubscribe()

    # -- simulation --------------------------------------------------------------------

    async def _on_sim(self, msg: Msg) -> None:
        try:
            request = msgspec.msgpack.decode(msg.data, type=SimRequest)
            if request.action == "domains":
                reply = SimReply(ok=True, domains=await asyncio.to_thread(self.guests.summaries))
            else:
                await self.simulate(request)
                reply = SimReply(ok=True)
        except (VirtbusError, libvirt.libvirtError, msgspec.DecodeError) as e:
            reply = SimReply(ok=False, error=str(e))
        except (TimeoutError, NatsError) as e:  # only once the agent stops, or refused
            reply = SimReply(ok=False, error=describe(e))
        await msg.respond(msgspec.msgpack.encode(reply))

    async def simulate(self, request: SimRequest) -> None:
        """Something happens to the simulated host (`virtbus sim`); refused on a real one."""
        await self.host.simulate(request, self)

    async def switch_off(self) -> None:
        """A simulated agent stop: no heartbeats, reports or work until `switch_on`."""
        self.log.warning("simulated agent stop: no heartbeats, reports or work")
        self.active.clear()

    async def switch_on(self) -> None:
        """The simulated agent stop ends: the host reported again, the guests reconciled."""
        self.active.set()
        await self.reporter.report_host(force=True)
        await self.reconciler.reconcile()
