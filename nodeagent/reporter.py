"""What the agent says, on `<P>_REPORTS`: its host, each guest's phase and interfaces, and
(for `nodeagent.migrating`) its migrations. It never writes events: the control plane
decides what a report means.

A report made while node work is done carries that work's correlation id (`serving`). A
report NATS fails for a moment is tried again in place (its id makes a retry one report); a
silenced agent (a simulated agent stop) says nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import socket
from collections.abc import Iterator

import msgspec
import structlog
from nats.aio.client import Client
from nats.errors import Error as NatsError

from events.api.hco_defaults import KUBEVIRT_MIN_CPU_MODEL
from events.api.vm import VirtualMachineInstanceNetworkInterface
from events.jetstream.transient import retry_while_running
from events.language.ids import random_uuid
from events.language.messages import DomainObservation, InterfacesObservation, NodeReport
from events.language.query import Query
from events.language.subjects import Layout
from events.runtime.aio import pause_unless_stopped
from nodeagent.discovery import DiscoveryConfig, discover_host, host_fingerprint
from nodeagent.host import Host
from nodeagent.phases import FINISHED, GuestPhase
from nodeagent.readservice import ReadService, ReadServiceUnavailable
from nodeagent.vmiref import VMIRef
from nodeagent.worklog import WorkLog

log = structlog.get_logger(__name__)

KUBEVIRT_KIND = "KubeVirt"

SERVING: contextvars.ContextVar[str] = contextvars.ContextVar("serving", default="")
"""The correlation id of the node work being done; reports made for it carry it along."""


@contextlib.contextmanager
def serving(correlation_id: str) -> Iterator[None]:
    token = SERVING.set(correlation_id)
    try:
        yield
    finally:
        SERVING.reset(token)


class Reporter:
    """One node's reports."""

    def __init__(self, nc: Client, layout: Layout, host: Host, worklog: WorkLog,
                 reads: ReadService, *, discovery: DiscoveryConfig, active: asyncio.Event,
                 stop: asyncio.Event) -> None:
        self.nc, self.layout, self.host, self.worklog = nc, layout, host, worklog
        self.reads = reads
        self.node = discovery.node_name
        self.discovery = discovery
        self.active = active
        """Cleared while the agent is silenced: nothing is reported."""
        self.stop = stop
        """The agent's stop: a report NATS keeps failing is retried until it."""
        self.log = log.bind(node=self.node)
        self.fingerprint = ""
        self.reported: dict[str, tuple[str, bool, str]] = {}
        """Each running guest's last report (phase, paused, why paused), by VMI uid, or the
        one its launch under way is about to make: libvirt's echo of a launch (which may come
        before the launch reports) repeats it, and a repeat changes nothing in the control
        plane, so it is not reported (nor the host saved) again."""

    async def report(self, report: NodeReport) -> None:
        if not self.active.is_set():
            return
        subject = self.layout.report_subject(self.node, report.kind)
        report = msgspec.structs.replace(report,
                                         correlation_id=report.correlation_id or SERVING.get())
        js = self.nc.jetstream()
        await retry_while_running(
            lambda: js.publish(subject, msgspec.msgpack.encode(report),
                               headers={"Nats-Msg-Id": report.id}),
            "reporting", self.stop, node=self.node, kind=report.kind)

    async def report_domain(self, ref: VMIRef, phase: str, reason: str = "", *,
                            gone: bool = False, paused: bool = False,
                            paused_reason: str = "", agent_connected: bool | None = None) -> None:
        """Report a guest's phase; a finished one is marked so first, never to launch again
        (a report lost after the mark is made again by the next start's reconcile)."""
        if phase in FINISHED:
            await self.worklog.record_finished(ref.uid, reason or phase)
        obs = DomainObservation(namespace=ref.namespace, name=ref.name, uid=ref.uid,
                                phase=phase, reason=reason, gone=gone, paused=paused,
                                paused_reason=paused_reason, agent_connected=agent_connected)
        self.log.info("observed", vmi=ref.name, namespace=ref.namespace, phase=phase,
                      gone=gone, paused=paused, paused_reason=paused_reason, reason=reason,
                      agent_connected=agent_connected)
        await self.report(NodeReport(id=random_uuid(), node=self.node, kind="domain",
                                     domain=obs))
        if gone or phase != GuestPhase.RUNNING:
            self.reported.pop(ref.uid, None)
        else:
            self.reported[ref.uid] = (phase, paused, paused_reason)

    async def report_launch_failed(self, ref: VMIRef, error: Exception) -> None:
        await self.report_domain(ref, GuestPhase.FAILED, f"launch failed: {error}")

    async def report_interfaces(self, ref: VMIRef,
                                interfaces: list[VirtualMachineInstanceNetworkInterface]) -> None:
        self.log.info("interfaces observed", vmi=ref.name, namespace=ref.namespace,
                      interfaces=[(i.name, i.mac, i.ip_address) for i in interfaces])
        await self.report(NodeReport(
            id=random_uuid(), node=self.node, kind="interfaces",
            interfaces=InterfacesObservation(namespace=ref.namespace, name=ref.name,
                                             uid=ref.uid, interfaces=interfaces)))

    async def report_host(self, *, force: bool = False) -> None:
        """Discover the host; report it when it changed since the last report, or `force`."""
        await self._follow_cluster_cpu_policy()
        self.discovery = dataclasses.replace(self.discovery, domain_type=self.host.domain_type)
        info = await asyncio.to_thread(discover_host, self.host.conn, self.discovery)
        info = msgspec.structs.replace(info, hostname=socket.gethostname())
        fingerprint = host_fingerprint(info)
        if fingerprint == self.fingerprint and not force:
            return
        await self.report(NodeReport(id=random_uuid(), node=self.node, kind="node",
                                     info=msgspec.to_builtins(info)))
        self.fingerprint = fingerprint  # only once reported: a failed report is tried again

    async def rediscover(self, stop: asyncio.Event, interval: float) -> None:
        """Report the host again every `interval` when it changed."""
        while not stop.is_set():
            await pause_unless_stopped(stop, interval)
            if not stop.is_set() and self.active.is_set():
                try:
                    await self.report_host()
                except (TimeoutError, NatsError) as e:
                    self.log.warning("host not reported; trying again", error=str(e))

    async def _follow_cluster_cpu_policy(self) -> None:
        """Take `obsoleteCPUModels`, `minCPUModel` and `developerConfiguration.useEmulation`
        from the effective KubeVirt CR, as virt-handler does; keep the current ones while the
        read service cannot say."""
        try:
            answer = await self.reads.query(Query(kind=KUBEVIRT_KIND))
        except ReadServiceUnavailable:
            return
        if not answer.items:
            return
        config = answer.items[0].get("spec", {}).get("configuration", {})
        obsolete = config.get("obsoleteCPUModels") or {}
        models = {m for m, on in obsolete.items() if on} if isinstance(obsolete, dict) \
            else set(obsolete)
        developer = config.get("developerConfiguration") or {}
        self.host.use_emulation(developer.get("useEmulation") is True)
        self.discovery = dataclasses.replace(
            self.discovery, obsolete_cpu_models=frozenset(models),
            min_cpu_model=config.get("minCPUModel") or KUBEVIRT_MIN_CPU_MODEL)
