"""The node agent: its node's commands in, libvirt driven, observations out.

It never writes events. It reports what it sees (its host, each guest's phase) and the
control plane decides what that means. Work comes from the node's work-queue consumer, one
item at a time, and is acknowledged only after it is done, reported and recorded.

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
  and without a domain, and reports it gone (the reconcile below); it stays finished.
- an orphan marked finished, its domain not yet removed: the next reconcile removes it.

An item that does not decode or does not make sense (another verb than its subject's, no
event id or uid, a VMI to launch that is not the command's) is logged with its subject,
counted and terminated; so is one that trips an unexpected error. Nothing read from the wire
stops the agent. An item the agent could not finish for NATS's sake (no ack, no record) is
delivered again, at most `WORK_MAX_DELIVER` times.

Nor does a NATS failover stop it: what NATS fails for a moment (a timeout, no responders, a
503, a leader being elected: `events.jetstream.transient`) is tried again where it failed, one log
line per attempt, in every start-up query, report, record, pull and heartbeat.

At start (and when a simulated agent stop ends) it reconciles as virt-handler does: it asks
the read service which VMIs the cluster placed on this node, reports those that ran here
but have no domain any more as gone, and removes domains that no active VMI here owns (a
prepared incoming migration's guest excepted).
A domain that stops on its own (guest poweroff, crash) is removed once reported, so the
VMI's replacement can take its name.

Live migration's verbs, and what a restart makes of a migration, are `nodeagent.migrating`'s;
the agent hands them over where it checks work, starts, reconciles and stops.

With `sim_state` (test driver only) the simulated host is kept in a file (see
`nodeagent.simhost`), saved after each change the agent makes or reports and before it
reports or acknowledges it, so what the cluster heard of is on file. A kill between a
libvirt change and its save loses that change from the file: the next agent finds the host
as it was, the cluster never heard of the change, and the unacknowledged command that made
it is redelivered (every command is idempotent); a simulated guest action (crash, shutdown,
I/O error) that was not yet reported did not happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final, TypeVar

import libvirt
import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.kv import KeyValue

from events.api.errors import InvalidSpec, VirtbusError
from events.api.hco_defaults import KUBEVIRT_MIN_CPU_MODEL
from events.api.resources import load_quantity_parser, vmi_resources
from events.api.validation import START_PAUSED
from events.api.vm import VirtualMachineInstanceNetworkInterface, VirtualMachineInstanceSpec
from events.jetstream.connect import Access, connect
from events.jetstream.streams import (
    HEARTBEAT_INTERVAL,
    WORK_MAX_DELIVER,
    wait_for_streams,
    work_consumer,
)
from events.jetstream.transient import (
    describe,
    is_transient,
    note,
    retry_until_stopped,
    retry_while_running,
)
from events.language.ids import random_uuid
from events.language.messages import (
    MAX_ID_LENGTH,
    MAX_NAME_LENGTH,
    MAX_TOKEN_LENGTH,
    DomainObservation,
    DomainSummary,
    InterfacesObservation,
    NodeCommand,
    NodeReport,
    SimReply,
    SimRequest,
    node_actor,
)
from events.language.query import Answer, Query, ask
from events.language.subjects import DEFAULT_PREFIX, Layout, encode_token
from events.runtime.aio import claimed, pause_unless_stopped, together, unless_stopped
from nodeagent import downwardmetrics, guestdisks, lifecycle
from nodeagent.console import ConsolePublisher
from nodeagent.converter import convert
from nodeagent.converter import defaults as converter_defaults
from nodeagent.converter.context import DomainType, domain_name
from nodeagent.converter.identity import VMI_METADATA_TAG
from nodeagent.defaults import (
    AGENT_VERSION,
    BRIDGE,
    DEVICE_PLUGIN_CAPACITY,
    DOMAIN_MISSING_REASON,
    DOWNWARD_METRICS_INTERVAL_SECONDS,
    FETCH_WAIT_SECONDS,
    HYPERVISOR_PROBE_SECONDS,
    IMAGE_DIR,
    MIGRATION_REPORT_INTERVAL_SECONDS,
    NETWORK_DIR,
    POD_SUBNET,
    READ_SERVICE_RETRY_SECONDS,
    READ_SERVICE_WAIT_SECONDS,
    REDISCOVERY_INTERVAL_SECONDS,
    SIMULATED_BANDWIDTH_BYTES_PER_SECOND,
    SIMULATED_DIRTY_RATE_BYTES_PER_SECOND,
    STOP_RETRY_SECONDS,
    TEST_HOST_CPU_MODEL,
)
from nodeagent.devices import DeviceLedger
from nodeagent.discovery import DiscoveryConfig, discover_host, host_fingerprint
from nodeagent.domxml import parse_manifest
from nodeagent.guestagent import AgentChange, GuestAgentWatcher, agent_connected, running_verdict
from nodeagent.hostpaths import HostPathError
from nodeagent.hypervisor import Hypervisor, HypervisorChoice, guest_owner, kvm_runs_guests
from nodeagent.imagestore import ImageStore
from nodeagent.migrating import Migrations
from nodeagent.network.node import NodeNetwork, host_interfaces, parse_subnet
from nodeagent.network.tools import NetworkError
from nodeagent.phases import GuestPhase, Observation, StopCause, judge
from nodeagent.simhost import TEST_DEFAULT_URI, for_agent
from nodeagent.virterror import is_no_domain, quiet_libvirt_errors
from nodeagent.vmiref import VMIRef as VMIRef  # noqa: PLC0414 (re-exported)
from nodeagent.watcher import LifecycleWatcher, start_event_loop, to_asyncio
from nodeagent.worklog import open_worklog

log = structlog.get_logger(__name__)

T = TypeVar("T")

SERVING: contextvars.ContextVar[str] = contextvars.ContextVar("serving", default="")
"""The correlation id of the node work being done; reports made for it carry it along."""


@contextlib.contextmanager
def _serving(correlation_id: str) -> Iterator[None]:
    token = SERVING.set(correlation_id)
    try:
        yield
    finally:
        SERVING.reset(token)

VMI_KIND = "VirtualMachineInstance"
KUBEVIRT_KIND = "KubeVirt"
FINISHED = frozenset({GuestPhase.SUCCEEDED, GuestPhase.FAILED})
LAUNCHING_VERBS = frozenset({"launch", "migrate-finish"})
"""The verbs that start a guest: a failure to is reported as the VMI's."""


class ReadServiceUnavailable(VirtbusError):
    """The read service did not answer (yet)."""


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    nats_url: str
    nats_credentials: str = ""
    """Paths, as in `events.jetstream.connect.Access`: the secrets stay in their files."""
    nats_ca: str = ""
    nats_cert: str = ""
    nats_key: str = ""
    prefix: str = DEFAULT_PREFIX
    libvirt_uri: str = TEST_DEFAULT_URI
    kvm_devices: int = DEVICE_PLUGIN_CAPACITY
    tun_devices: int = DEVICE_PLUGIN_CAPACITY
    host_cpu_model: str = ""
    """'' means: libvirt's own, or `TEST_HOST_CPU_MODEL` on the test driver."""
    disk_dir: str = converter_defaults.DISK_DIR
    image_dir: str = IMAGE_DIR
    """The node's image store: containerDisk and kernelBoot images (`--image-dir`)."""
    rediscovery_seconds: float = REDISCOVERY_INTERVAL_SECONDS
    downward_metrics_seconds: float = DOWNWARD_METRICS_INTERVAL_SECONDS
    read_service_wait_seconds: float = READ_SERVICE_WAIT_SECONDS
    sim_state: str = ""
    """A file to keep the test driver's host in (`--sim-state`); '' keeps it in memory."""
    agent_version: str = AGENT_VERSION
    sim_migration_bandwidth: int = SIMULATED_BANDWIDTH_BYTES_PER_SECOND
    """Bytes per second of the test driver's simulated migration link."""
    sim_dirty_rate: int = SIMULATED_DIRTY_RATE_BYTES_PER_SECOND
    """Bytes per second a simulated guest dirties, unless its VMI's annotation says."""
    migration_report_seconds: float = MIGRATION_REPORT_INTERVAL_SECONDS
    migration_address: str = ""
    """Where a real host takes migrations in (its libvirtd and QEMU listen there); '' is
    its host name, as libvirt itself picks when told none."""
    hypervisor: HypervisorChoice = "auto"
    """`kvm` or `qemu` as told, or `auto`: KVM if the probe finds it runs guests."""
    hypervisor_probe_seconds: float = HYPERVISOR_PROBE_SECONDS
    sim_cpus: int = 0
    """A simulated host's CPUs (`nodeagent fleet --cpu`); 0 keeps the test driver's."""
    sim_memory: int = 0
    """A simulated host's memory in bytes (`nodeagent fleet --memory`); 0 keeps the driver's."""
    bridge: str = BRIDGE
    """A real host's guests' bridge (`nodeagent.network`)."""
    pod_subnet: str = POD_SUBNET
    network_dir: str = NETWORK_DIR

    @property
    def simulated(self) -> bool:
        return lifecycle.is_test_driver(self.libvirt_uri)

    @property
    def access(self) -> Access:
        return Access(self.nats_url, credentials=self.nats_credentials, ca=self.nats_ca,
                      cert=self.nats_cert, key=self.nats_key)


INSTANCE_VERBS: Final = frozenset({"pause", "unpause", "restart"})
"""Verbs on a running guest: done only to the instance (uid) the work names, as a stop."""


def vmi_of(dom: libvirt.virDomain, installation: str) -> VMIRef | None:
    """The VMI a domain belongs to, from the metadata the converter writes; None for a
    domain of no VMI, or of another installation's (two sharing a host leave each other's
    guests alone; a domain that names none is taken as this one's)."""
    found = ET.fromstring(dom.XMLDesc(0)).find(f"metadata/{VMI_METADATA_TAG}")
    if found is None or found.get("installation", installation) != installation:
        return None
    return VMIRef(found.get("namespace", ""), found.get("name", ""), found.get("uid", ""))


class NodeAgent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.layout = Layout(cfg.prefix)
        self.log = log.bind(node=cfg.node)
        self.domains: dict[str, VMIRef] = {}
        self.metrics_disks: dict[str, tuple[str, ...]] = {}
        """Domain name to the downwardMetrics disks the agent refreshes for it."""
        self.active = asyncio.Event()
        self.active.set()
        self.started = asyncio.Event()
        """Set once the agent has reconciled and takes work."""
        self.busy = asyncio.Lock()
        """Held while a node command runs or the agent reconciles, so neither sees the
        other half done."""
        self.reported: dict[str, tuple[str, bool, str]] = {}
        """Each running guest's last report (phase, paused, why paused), by VMI uid, or the
        one its launch under way is about to make: libvirt's echo of a launch (which may come
        before the launch reports) repeats it, and a repeat changes nothing in the control
        plane, so it is not reported (nor the host saved) again."""
        self.in_progress: dict[str, str] = {}
        """Domain name to the correlation id of the node command acting on it right now, so
        libvirt's echo of that action, if the watcher reports it first, carries the id too."""
        self.nc: Client | None = None
        self.stop = asyncio.Event()
        """The agent's stop (given to `run`): what NATS keeps failing is retried until it."""
        self.rejected = 0
        """Work items terminated as bad since start (each logged with its subject)."""
        self.fingerprint = ""
        self.host = for_agent(cfg.libvirt_uri, cfg.sim_state)
        cpu_model = cfg.host_cpu_model or (TEST_HOST_CPU_MODEL if cfg.simulated else "")
        self.discovery = DiscoveryConfig(node_name=cfg.node, kvm_devices=cfg.kvm_devices,
                                         tun_devices=cfg.tun_devices, host_cpu_model=cpu_model,
                                         agent_version=cfg.agent_version,
                                         cpus=cfg.sim_cpus, memory_bytes=cfg.sim_memory)
        self.migrations = Migrations(self)
        self.images = ImageStore(cfg.image_dir)
        self.network = None if cfg.simulated else NodeNetwork(
            cfg.bridge, parse_subnet(cfg.pod_subnet), cfg.network_dir)

    # -- start-up ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, nc: Client | None = None) -> None:
        """Serve until `stop`; on `nc` when given (a fleet's one connection, left open),
        else on a connection of its own."""
        self.stop = stop
        quiet_libvirt_errors()
        load_quantity_parser()  # now, not on the loop of the first launch, beside heartbeats
        loop = asyncio.get_running_loop()
        uri = self.cfg.libvirt_uri if self.host is None else self.host.uri
        start_event_loop()  # before the connection, or a remote one (qemu:///system) reads
        # its events only while some other call of ours is on the wire
        self.conn = await asyncio.to_thread(libvirt.open, uri)
        observations: asyncio.Queue[Observation] = asyncio.Queue()
        self.watcher = LifecycleWatcher(self.conn, to_asyncio(loop, observations),
                                        node=self.cfg.node)
        agent_changes: asyncio.Queue[AgentChange] = asyncio.Queue()
        guest_agents = None if self.cfg.simulated else GuestAgentWatcher(
            self.conn, lambda change: loop.call_soon_threadsafe(agent_changes.put_nowait, change))
        self.capabilities = capabilities = await asyncio.to_thread(self.conn.getCapabilities)
        kvm = await asyncio.to_thread(kvm_runs_guests, self.cfg.libvirt_uri, capabilities,
                                      self.cfg.hypervisor, self.cfg.hypervisor_probe_seconds,
                                      node=self.cfg.node)
        self.hypervisor = Hypervisor(self.cfg.libvirt_uri, kvm)
        self.nc = nc or await connect(self.cfg.access, f"agent-{self.cfg.node}")
        self.consoles = ConsolePublisher(self.nc, self.layout, self.cfg.node,
                                         converter_defaults.RUN_DIR)
        try:
            js = self.nc.jetstream()
            if not await unless_stopped(wait_for_streams(js, self.layout), stop):
                return
            opened = asyncio.ensure_future(self._nats(
                lambda: open_worklog(js, self.layout, self.cfg.node), "opening the work log"))
            if not await unless_stopped(opened, stop):
                return
            self.worklog = opened.result()
            await self._adopt_domains()
            await self.migrations.resume()
            if self.network is not None:  # kept: the running guests' and the prepared ones'
                await asyncio.to_thread(self.network.start,
                                        {ref.uid for ref in self.domains.values()}
                                        | set(self.migrations.book.incoming))
            await self.report_host(force=True)
            sim = await self.nc.subscribe(self.layout.agent_subject(self.cfg.node, "sim"),
                                          cb=self._on_sim)
            heartbeat = asyncio.ensure_future(self._heartbeat(stop))
            if await unless_stopped(self.reconcile(), stop):
                self.log.info("agent started", libvirt_uri=self.cfg.libvirt_uri,
                              domains=len(self.domains))
                self.started.set()
                await together(self._consume(stop), self._pump(observations, stop),
                               self._rediscover(stop), self._refresh_metrics(stop),
                               self.migrations.serve(stop), self.consoles.serve(stop),
                               self._report_agent_changes(agent_changes, stop),
                               self._watch_interfaces(stop))
            await heartbeat
            await sim.unsubscribe()
        finally:
            self.watcher.close()
            if guest_agents is not None:
                guest_agents.close()
            if nc is None:
                await self.nc.close()
            await asyncio.to_thread(self.conn.close)

    @property
    def domain_type(self) -> DomainType:
        """What this node's guests are defined as (`nodeagent.hypervisor`)."""
        return self.hypervisor.domain_type

    async def _adopt_domains(self) -> None:
        """After a restart: find our guests, rebuild the device ledger, report their phase."""
        for dom in await asyncio.to_thread(self.conn.listAllDomains, 0):
            ref = vmi_of(dom, self.cfg.prefix)
            if ref is None:
                continue
            self.domains[ref.domain] = ref
            if not self.cfg.simulated:
                await self.consoles.follow(ref)
            found = judge(*dom.state())
            if found.phase is not None:
                connected = None if self.cfg.simulated or found.phase is not GuestPhase.RUNNING \
                    else await asyncio.to_thread(agent_connected, dom)
                await self.report_domain(ref, found.phase, "found at agent start",
                                         paused=found.paused, paused_reason=found.paused_reason,
                                         agent_connected=connected)
        self.ledger = DeviceLedger.rebuild(self.discovery.device_capacity(),
                                           [r.uid for r in self.domains.values()],
                                           node=self.cfg.node)

    async def reconcile(self) -> None:
        """Compare this host's domains with the VMIs the cluster placed here (see above)."""
        async with self.busy:
            try:
                assigned = await self._assigned()
            except ReadServiceUnavailable as e:
                self.log.warning("not reconciled: the read service did not answer", error=str(e))
                return
            await self.migrations.reconcile(assigned)
            present = {ref.uid for ref in self.domains.values()}
            for ref, phase, vmi in assigned.values():
                if ref.uid in present:
                    self._adopt_spec(ref, vmi)
                elif phase == GuestPhase.RUNNING:
                    await self.report_domain(ref, GuestPhase.FAILED, DOMAIN_MISSING_REASON,
                                             gone=True)
            for ref in list(self.domains.values()):
                # A prepared migration's guest is the migration's to settle (its finish, its
                # cleanup, or its VMI moving here): libvirt may have handed it over already.
                if ref.uid not in assigned and ref.uid not in self.migrations.book.incoming:
                    self.log.warning("removing a domain no active VMI here owns", vmi=ref.name,
                                     namespace=ref.namespace, uid=ref.uid)
                    await self._nats(functools.partial(
                        self.worklog.record_finished, ref.uid, "no active VMI here owns it"),
                        "recording a finished VMI")
                    await self._remove(ref)

    def _adopt_spec(self, ref: VMIRef, vmi: dict[str, Any]) -> None:
        """A guest adopted at start holds one of each device until its VMI's spec says
        what its launch took, and has its metrics disks refreshed again; a spec that no
        longer parses keeps the safe count, and one whose metrics disks would lie outside
        the VMI's directory has none refreshed."""
        try:
            spec, ctx = parse_manifest(vmi, domain_type=self.domain_type,
                                       disk_dir=self.cfg.disk_dir)
        except InvalidSpec as e:
            self.log.warning("devices of an adopted guest left as counted", vmi=ref.name,
                             error=str(e))
            return
        self.ledger.correct(ref.uid, self._device_demand(spec))
        try:
            disks = downwardmetrics.disk_paths(spec, ctx)
        except HostPathError as e:
            self.log.warning("metrics disks of an adopted guest not refreshed", vmi=ref.name,
                             error=str(e))
            return
        if disks:
            self.metrics_disks[ref.domain] = disks

    def _device_demand(self, spec: VirtualMachineInstanceSpec) -> dict[str, int]:
        """The device-plugin resources a VMI's launch takes (hugepages are not devices)."""
        demand = vmi_resources(spec.domain, emulation=self.domain_type != "kvm").extended
        tracked = self.ledger.tracked()
        return {k: v for k, v in demand.items() if k in tracked}

    async def _assigned(self) -> dict[str, tuple[VMIRef, str, dict[str, Any]]]:
        """Active VMIs placed on this node, by uid, as of the log's end when we asked."""
        deadline = time.monotonic() + self.cfg.read_service_wait_seconds
        while True:
            try:
                answer = await self._query(Query(kind=VMI_KIND, node=self.cfg.node))
                break
            except ReadServiceUnavailable:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(READ_SERVICE_RETRY_SECONDS)  # retry backoff
        out: dict[str, tuple[VMIRef, str, dict[str, Any]]] = {}
        for item in answer.items:
            meta, status = item["metadata"], item.get("status", {})
            phase = status.get("phase", "")
            if status.get("nodeName") == self.cfg.node and phase not in FINISHED:
                ref = VMIRef(meta["namespace"], meta["name"], meta["uid"])
                out[meta["uid"]] = (ref, phase, item)
        return out

    async def _query(self, query: Query) -> Answer:
        """Ask the read service, as of the log's end now."""
        assert self.nc is not None
        try:
            info = await self.nc.jetstream().stream_info(self.layout.events_stream)
            answer = await ask(self.nc, self.layout,
                               msgspec.structs.replace(query, after=info.state.last_seq),
                               node_actor(self.cfg.node))
        except Exception as e:  # no read service (yet), or NATS failing for a moment
            if not is_transient(e):
                raise
            raise ReadServiceUnavailable(describe(e)) from e
        if answer.error:
            raise ReadServiceUnavailable(answer.error)
        return answer

    async def _another_instances(self, ref: VMIRef, what: str) -> bool:
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
            dom = self.conn.lookupByName(ref.domain)
        except libvirt.libvirtError as e:
            if is_no_domain(e):
                return None
            raise
        return vmi_of(dom, self.cfg.prefix) or VMIRef(ref.namespace, ref.name, "")

    async def _remove(self, ref: VMIRef, grace_seconds: int = 0) -> lifecycle.StopOutcome:
        """Stop (if it still runs; at once unless given a grace period) and undefine a domain,
        and forget it. A domain of the name that another instance (uid) of the VMI holds is
        not this one's: left alone, as this one is gone (a stop of a VMI failed on a lost
        node may come after its replacement was launched here)."""
        if await self._another_instances(ref, "stopped"):
            return lifecycle.StopOutcome.ALREADY_GONE
        outcome = await asyncio.to_thread(lifecycle.graceful_stop, self.conn, ref.domain,
                                          grace_seconds, self.watcher)
        await self.consoles.forget(ref)  # its last words, before its log goes
        if not self.cfg.simulated:
            await asyncio.to_thread(guestdisks.remove, self.cfg.disk_dir,
                                    converter_defaults.RUN_DIR, ref.namespace, ref.name,
                                    ref.uid)
        if self.network is not None:
            await asyncio.to_thread(self.network.detach, ref.uid)
        self.ledger.release(ref.uid)
        self.reported.pop(ref.uid, None)
        self.domains.pop(ref.domain, None)
        self.metrics_disks.pop(ref.domain, None)
        await self._persist()
        return outcome

    async def _persist(self) -> None:
        """Save the simulated host, if it is kept in a file, before anyone hears of a change."""
        if self.host is not None:
            await asyncio.to_thread(self.host.save, self.conn)

    # -- reports -----------------------------------------------------------------------

    async def _report(self, report: NodeReport) -> None:
        if not self.active.is_set() or self.nc is None:
            return
        subject = self.layout.report_subject(self.cfg.node, report.kind)
        report = msgspec.structs.replace(report,
                                         correlation_id=report.correlation_id or SERVING.get())
        js = self.nc.jetstream()
        await self._nats(lambda: js.publish(subject, msgspec.msgpack.encode(report),
                                            headers={"Nats-Msg-Id": report.id}),
                         "reporting", kind=report.kind)  # its id makes a retry one report

    async def _nats(self, call: Callable[[], Awaitable[T]], what: str, **context: Any) -> T:
        """`call()`, tried again in place while NATS fails it for a moment (a server lost, a
        leader being elected), one log line per attempt: the agent rides a failover out
        rather than exit. Once the agent stops, the last failure is raised."""
        return await retry_while_running(call, what, self.stop, node=self.cfg.node, **context)

    async def _follow_cluster_cpu_policy(self) -> None:
        """Take `obsoleteCPUModels`, `minCPUModel` and `developerConfiguration.useEmulation`
        from the effective KubeVirt CR, as virt-handler does; keep the current ones while the
        read service cannot say."""
        try:
            answer = await self._query(Query(kind=KUBEVIRT_KIND))
        except ReadServiceUnavailable:
            return
        if not answer.items:
            return
        config = answer.items[0].get("spec", {}).get("configuration", {})
        obsolete = config.get("obsoleteCPUModels") or {}
        models = {m for m, on in obsolete.items() if on} if isinstance(obsolete, dict) \
            else set(obsolete)
        developer = config.get("developerConfiguration") or {}
        self.hypervisor = dataclasses.replace(
            self.hypervisor, use_emulation=developer.get("useEmulation") is True)
        self.discovery = dataclasses.replace(
            self.discovery, obsolete_cpu_models=frozenset(models),
            min_cpu_model=config.get("minCPUModel") or KUBEVIRT_MIN_CPU_MODEL)

    async def report_host(self, *, force: bool = False) -> None:
        """Discover the host; report it when it changed since the last report, or `force`."""
        await self._follow_cluster_cpu_policy()
        self.discovery = dataclasses.replace(self.discovery, domain_type=self.domain_type)
        info = await asyncio.to_thread(discover_host, self.conn, self.discovery)
        info = msgspec.structs.replace(info, hostname=socket.gethostname())
        fingerprint = host_fingerprint(info)
        if fingerprint == self.fingerprint and not force:
            return
        await self._report(NodeReport(id=random_uuid(), node=self.cfg.node, kind="node",
                                      info=msgspec.to_builtins(info)))
        self.fingerprint = fingerprint  # only once reported: a failed report is tried again

    async def report_domain(self, ref: VMIRef, phase: str, reason: str = "", *,
                            gone: bool = False, paused: bool = False,
                            paused_reason: str = "", agent_connected: bool | None = None) -> None:
        """Report a guest's phase; a finished one is marked so first, never to launch again
        (a report lost after the mark is made again by the next start's reconcile)."""
        if phase in FINISHED:
            await self._nats(lambda: self.worklog.record_finished(ref.uid, reason or phase),
                             "recording a finished VMI")
        obs = DomainObservation(namespace=ref.namespace, name=ref.name, uid=ref.uid,
                                phase=phase, reason=reason, gone=gone, paused=paused,
                                paused_reason=paused_reason, agent_connected=agent_connected)
        self.log.info("observed", vmi=ref.name, namespace=ref.namespace, phase=phase,
                      gone=gone, paused=paused, paused_reason=paused_reason, reason=reason,
                      agent_connected=agent_connected)
        await self._report(NodeReport(id=random_uuid(), node=self.cfg.node, kind="domain",
                                      domain=obs))
        if gone or phase != GuestPhase.RUNNING:
            self.reported.pop(ref.uid, None)
        else:
            self.reported[ref.uid] = (phase, paused, paused_reason)

    # -- loops -------------------------------------------------------------------------

    async def _watch_interfaces(self, stop: asyncio.Event) -> None:
        """A real host's guests' interfaces, reported as they change (`nodeagent.network`)."""
        if self.network is not None:
            await self.network.watch(stop, self.domains.values, self.report_interfaces)

    async def report_interfaces(self, ref: VMIRef,
                                interfaces: list[VirtualMachineInstanceNetworkInterface]) -> None:
        self.log.info("interfaces observed", vmi=ref.name, namespace=ref.namespace,
                      interfaces=[(i.name, i.mac, i.ip_address) for i in interfaces])
        await self._report(NodeReport(
            id=random_uuid(), node=self.cfg.node, kind="interfaces",
            interfaces=InterfacesObservation(namespace=ref.namespace, name=ref.name,
                                             uid=ref.uid, interfaces=interfaces)))

    async def _rediscover(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await pause_unless_stopped(stop, self.cfg.rediscovery_seconds)
            if not stop.is_set() and self.active.is_set():
                try:
                    await self.report_host()
                except (TimeoutError, NatsError) as e:
                    self.log.warning("host not reported; trying again", error=str(e))

    async def _refresh_metrics(self, stop: asyncio.Event) -> None:
        """Rewrite each guest's downwardMetrics disks, as virt-handler does; a failure is
        logged and the next tick tries again. A silenced agent writes nothing."""
        while not stop.is_set():
            await pause_unless_stopped(stop, self.cfg.downward_metrics_seconds)
            if stop.is_set() or not self.active.is_set() or not self.metrics_disks:
                continue
            try:
                host = await asyncio.to_thread(downwardmetrics.host_sample, self.conn,
                                               self.cfg.node)
            except libvirt.libvirtError as e:
                self.log.warning("downward metrics not written; trying again", error=str(e))
                continue
            for domain, disks in list(self.metrics_disks.items()):
                ref = self.domains.get(domain)
                if ref is None:
                    continue  # removed since this tick began
                try:
                    await asyncio.to_thread(downwardmetrics.refresh, self.conn, domain, disks,
                                            host)
                except (libvirt.libvirtError, downwardmetrics.MetricsDiskError) as e:
                    self.log.warning("downward metrics not written; trying again", vmi=ref.name,
                                     namespace=ref.namespace, error=str(e))

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        """A beat every `HEARTBEAT_INTERVAL`; one NATS cannot take (or a bucket it cannot
        bind yet) is one log line, and the next beat is the retry."""
        assert self.nc is not None
        js = self.nc.jetstream()
        kv: KeyValue | None = None
        key = encode_token(self.cfg.node)
        failures = 0
        while not stop.is_set():
            if self.active.is_set():
                try:
                    kv = kv or await js.key_value(self.layout.heartbeats_bucket)
                    await kv.put(key, str(time.time()).encode())
                    failures = 0
                except (TimeoutError, NatsError) as e:
                    failures += 1
                    if is_transient(e):
                        note("heartbeat", e, failures)
                    else:
                        self.log.warning("heartbeat not written", error=describe(e))
            await pause_unless_stopped(stop, HEARTBEAT_INTERVAL)

    async def _consume(self, stop: asyncio.Event) -> None:
        """Take the node's work one item at a time: an item fetched is an item claimed, so
        none waits out its ack wait in a batch behind slow work and comes twice. A pull NATS
        cannot serve (no consumer leader, a server lost, the consumer gone) is one log line,
        a pause, and a wait for the consumer, one line per look: the control plane creates
        it and sets it up again, the agent only binds to it
        (`events.jetstream.streams.work_consumer`)."""
        assert self.nc is not None
        js = self.nc.jetstream()
        durable = work_consumer(self.cfg.node)

        async def consumer_there() -> bool:
            return await retry_until_stopped(
                lambda: js.consumer_info(self.layout.node_stream, durable),
                "waiting for the node's work consumer (the control plane makes it)", stop,
                node=self.cfg.node) is not None

        if not await consumer_there():
            return
        sub = await js.pull_subscribe_bind(durable=durable, stream=self.layout.node_stream)
        failures = 0
        while not stop.is_set():
            if not self.active.is_set():
                await unless_stopped(self.active.wait(), stop)  # a silenced agent does nothing
                continue
            try:
                msgs = await sub.fetch(1, timeout=FETCH_WAIT_SECONDS)
            except TimeoutError:  # no work now
                continue
            except Exception as e:
                if not is_transient(e):
                    raise
                failures += 1
                await pause_unless_stopped(stop, note("taking node work", e, failures,
                                                      node=self.cfg.node))
                if not await consumer_there():
                    return
                continue
            failures = 0
            for msg in msgs:
                try:
                    await self._handle(msg)
                except (TimeoutError, NatsError) as e:  # NATS's trouble, not the work's
                    self.log.warning("node work unfinished; it is delivered again",
                                     subject=msg.subject, error=describe(e))

    async def _handle(self, msg: Msg) -> None:
        """One work item, isolated: a bad one is rejected, any other applied (see above)."""
        try:
            command = msgspec.msgpack.decode(msg.data, type=NodeCommand)
        except msgspec.DecodeError as e:
            await self._reject(msg, f"not a node command: {e}")
            return
        if refusal := self._refusal(command, msg.subject):
            await self.migrations.refused(command, refusal)
            await self._reject(msg, refusal, event_id=command.event_id)
            return
        ref = VMIRef(command.namespace, command.name, command.uid)
        with _serving(command.correlation_id), structlog.contextvars.bound_contextvars(
                vmi=ref.name, namespace=ref.namespace, verb=command.verb,
                event_id=command.event_id, command_id=command.command_id,
                correlation_id=command.correlation_id):
            try:
                await self._apply(msg, command, ref)
            except (TimeoutError, NatsError):
                raise
            except Exception as e:  # a bug this item trips must not stop the agent
                await self._reject(msg, f"{type(e).__name__}: {e}", event_id=command.event_id,
                                   error=e)

    def _refusal(self, command: NodeCommand, subject: str) -> str:
        """Why a decoded work item makes no sense as it stands; '' when it does."""
        if subject != self.layout.node_subject(self.cfg.node, command.verb):
            return f"a {command.verb!r} command on another verb's subject"
        if not command.event_id or not command.uid:
            return "no event id or no VMI uid: it could be neither recorded nor checked"
        for field, value, limit in (
                ("eventId", command.event_id, MAX_ID_LENGTH), ("uid", command.uid, MAX_ID_LENGTH),
                ("namespace", command.namespace, MAX_TOKEN_LENGTH),
                ("name", command.name, MAX_NAME_LENGTH)):
            if len(value) > limit:  # each becomes a subject, whose line the server limits
                return f"{field}: must be at most {limit} characters"
        if command.vmi is not None:
            meta = command.vmi.get("metadata")
            names = [meta.get(k) for k in ("namespace", "name", "uid")] \
                if isinstance(meta, dict) else []
            if names != [command.namespace, command.name, command.uid]:
                return "its VMI is not the one the command names"
        return self.migrations.refusal(command)

    async def _reject(self, msg: Msg, reason: str, *, event_id: str = "",
                      error: Exception | None = None) -> None:
        """Log (one line, with the subject), count and terminate a work item: JetStream
        never delivers it again and says so in a MSG_TERMINATED advisory."""
        self.rejected += 1
        self.log.error("node work rejected", subject=msg.subject, event_id=event_id,
                       reason=reason, rejected=self.rejected, exc_info=error)
        await msg.term()

    async def _apply(self, msg: Msg, command: NodeCommand, ref: VMIRef) -> None:
        """Do, report, record, acknowledge, in that order (the module gives the crash
        windows); an item whose event id is recorded already is only acknowledged."""
        if await self._nats(lambda: self.worklog.applied(command.event_id),
                            "looking up applied work"):
            self.log.info("node work already applied")
            await msg.ack()
            return
        self.log.info("node command")
        self.in_progress[ref.domain] = command.correlation_id
        try:
            async with claimed(msg), self.busy:
                await self.execute(command, ref)
        except (VirtbusError, libvirt.libvirtError) as e:
            self.log.warning("node command failed", error=str(e))
            if command.verb in LAUNCHING_VERBS:
                await self.report_launch_failed(ref, e)
            elif command.verb == "stop" and isinstance(e, libvirt.libvirtError) \
                    and msg.metadata.num_delivered < WORK_MAX_DELIVER:
                await msg.nak(delay=STOP_RETRY_SECONDS)  # not recorded: done again later
                return
        finally:
            self.in_progress.pop(ref.domain, None)
        await self._nats(lambda: self.worklog.record_applied(command), "recording applied work")
        await msg.ack()

    async def execute(self, command: NodeCommand, ref: VMIRef) -> None:
        if command.verb in INSTANCE_VERBS and await self._another_instances(ref, "done"):
            return
        match command.verb:
            case "launch":
                await self._launch(command.vmi, ref)
            case "stop":
                outcome = await self._remove(ref, command.grace_period_seconds)
                await self.report_domain(ref, GuestPhase.SUCCEEDED,
                                         f"stopped on request ({outcome})", gone=True)
            case "pause":
                await asyncio.to_thread(lifecycle.pause, self.conn, ref.domain)
                await self._persist()
            case "unpause":
                await asyncio.to_thread(lifecycle.unpause, self.conn, ref.domain)
                await self._persist()
            case "restart":
                await asyncio.to_thread(lifecycle.restart, self.conn, ref.domain, self.watcher)
                await self._persist()
            case _:
                await self.migrations.execute(command, ref)

    async def _launch(self, vmi: dict[str, Any] | None, ref: VMIRef) -> None:
        """Convert, create the metrics disks, define and start. Every host path is made and
        checked (`nodeagent.hostpaths`) by the conversion, before any file is created or
        the domain defined: a path outside the VMI's directory fails the launch."""
        if await self._nats(lambda: self.worklog.finished(ref.uid), "looking up a finished VMI"):
            self.log.info("launch of a finished VMI: nothing to do", uid=ref.uid)
            return
        if vmi is None:
            raise InvalidSpec("vmi", "a launch needs the VMI")
        spec, ctx = parse_manifest(vmi, domain_type=self.domain_type,
                                   disk_dir=self.cfg.disk_dir)
        ctx = msgspec.structs.replace(
            ctx, serial_log=not self.cfg.simulated, installation=self.cfg.prefix,
            host_interfaces=() if self.network is None else host_interfaces(ref.uid, spec))
        xml = convert(spec, ctx)
        metrics_disks = downwardmetrics.disk_paths(spec, ctx)
        if not self.cfg.simulated:  # a real guest needs its disks; a simulated one opens none
            await asyncio.to_thread(guestdisks.prepare, spec, ctx, self.images,
                                    guest_owner(self.capabilities, self.domain_type))
        for path in metrics_disks:
            await asyncio.to_thread(downwardmetrics.create_disk, path)
        self.ledger.acquire(ref.uid, self._device_demand(spec))
        start_paused = spec.start_strategy == START_PAUSED
        self.reported[ref.uid] = (GuestPhase.RUNNING, start_paused, "")
        self.domains[ref.domain] = ref
        if metrics_disks:
            self.metrics_disks[ref.domain] = metrics_disks
        try:
            if self.network is not None:
                await asyncio.to_thread(self.network.attach, ref, spec)
            dom = await asyncio.to_thread(lifecycle.define_and_start, self.conn, xml,
                                          paused=start_paused)
        except (libvirt.libvirtError, NetworkError):
            await self._remove(ref)  # the launch fails: nothing of it stays
            raise
        if not self.cfg.simulated:
            await self.consoles.follow(ref)
        paused = (await asyncio.to_thread(dom.state))[0] == libvirt.VIR_DOMAIN_PAUSED
        await self._persist()
        await self.report_domain(ref, GuestPhase.RUNNING, "launched", paused=paused)

    async def report_launch_failed(self, ref: VMIRef, error: Exception) -> None:
        await self.report_domain(ref, GuestPhase.FAILED, f"launch failed: {error}")

    async def _pump(self, observations: asyncio.Queue[Observation], stop: asyncio.Event) -> None:
        """Report what libvirt says of our guests; what NATS fails for a moment is retried
        in place (`_nats`), and what it refuses is one line: the pump never stops."""
        while not stop.is_set():
            try:
                obs = await asyncio.wait_for(observations.get(), 1.0)
            except TimeoutError:
                continue
            ref = self.domains.get(obs.name)
            verdict = obs.verdict
            phase = verdict.phase
            if ref is None or phase is None or obs.cause is StopCause.REQUESTED:
                continue  # not ours, no change, or a stop whose command reports it
            reason = obs.reason
            with _serving(self.in_progress.get(ref.domain, "")):
                try:
                    if phase is GuestPhase.RUNNING:
                        verdict = await asyncio.to_thread(lifecycle.verdict_now, self.conn, obs)
                        seen = (phase, verdict.paused, verdict.paused_reason)
                        if self.reported.get(ref.uid) == seen:
                            continue  # reported already, as it is
                        await self._persist()
                        await self.report_domain(ref, phase, reason, paused=verdict.paused,
                                                 paused_reason=verdict.paused_reason)
                    else:
                        await self._remove(ref)
                        await self.report_domain(ref, phase, reason, gone=True)
                except (TimeoutError, NatsError) as e:
                    self.log.warning("observation not reported", vmi=ref.name,
                                     namespace=ref.namespace, phase=phase, error=describe(e))
                except libvirt.libvirtError as e:  # the next event, or the reconcile, tells
                    self.log.error("observation not reported: libvirt failed", vmi=ref.name,
                                   namespace=ref.namespace, phase=phase, error=str(e))

    async def _report_agent_changes(self, changes: asyncio.Queue[AgentChange],
                                    stop: asyncio.Event) -> None:
        """Report each guest agent that connects or disconnects, with its guest's state now
        (a guest that stopped meanwhile has its stop reported instead), while no node
        command runs: a pause's report and this one say the same of the pause."""
        while not stop.is_set():
            try:
                change = await asyncio.wait_for(changes.get(), 1.0)
            except TimeoutError:
                continue
            ref = self.domains.get(change.name)
            if ref is None:
                continue
            try:
                async with self.busy:
                    now = await asyncio.to_thread(running_verdict, self.conn, change.name)
                    if now is not None:
                        await self.report_domain(ref, GuestPhase.RUNNING, paused=now.paused,
                                                 paused_reason=now.paused_reason,
                                                 agent_connected=change.connected)
            except (TimeoutError, NatsError, libvirt.libvirtError) as e:
                self.log.warning("guest agent change not reported", vmi=ref.name,
                                 namespace=ref.namespace, error=describe(e))

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
        except (TimeoutError, NatsError) as e:  # only once the agent stops, or refused
            reply = SimReply(ok=False, error=describe(e))
        await msg.respond(msgspec.msgpack.encode(reply))

    def summaries(self) -> list[DomainSummary]:
        """The host's guests that belong to VMIs, as libvirt reports them now."""
        out = []
        for dom in self.conn.listAllDomains(0):
            ref = vmi_of(dom, self.cfg.prefix)
            if ref is not None:
                out.append(DomainSummary(name=dom.name(), uid=ref.uid, state=dom.state()[0]))
        return out

    async def simulate(self, request: SimRequest) -> None:
        lifecycle.ensure_test_uri(self.cfg.libvirt_uri)
        domain = domain_name(request.namespace, request.name)
        match request.action:
            case "guest-shutdown":
                await asyncio.to_thread(lifecycle.simulate_guest_shutdown, self.conn, domain,
                                        self.watcher)
            case "guest-crash":
                await asyncio.to_thread(lifecycle.simulate_guest_crash, self.conn, domain,
                                        self.watcher)
            case "guest-io-error":
                await asyncio.to_thread(lifecycle.simulate_guest_io_error, self.conn, domain,
                                        self.watcher)
            case "agent-stop":
                self.log.warning("simulated agent stop: no heartbeats, reports or work")
                self.active.clear()
            case "agent-start":
                self.active.set()
                await self.report_host(force=True)
                await self.reconcile()
