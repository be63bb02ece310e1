"""The agent in-process, on real NATS and the shared `test:///default` host: a restart
neither loses nor duplicates guests nor miscounts their devices (also when the host is kept
in a `sim_state` file), a launch executed twice makes one domain, discovery is re-reported
when the host changes, simulations are refused off the test driver, and a guest's
downwardMetrics disk is written at launch and refreshed, also after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import libvirt
import msgspec
import nats
import pytest

from controlplane.hco.controller import HCOController
from events.api import hco_defaults
from events.api.resources import KVM_DEVICE, TUN_DEVICE, _quantity_parser
from events.jetstream.streams import ensure_all
from events.language.messages import (
    Command,
    DomainObservation,
    NodeCommand,
    NodeReport,
    SimRequest,
    node_actor,
)
from events.language.query import Query, ask
from events.language.subjects import Layout
from nodeagent import lifecycle
from nodeagent.agent import NodeAgent
from nodeagent.config import AgentConfig
from nodeagent.converter import convert
from nodeagent.defaults import DOMAIN_MISSING_REASON
from nodeagent.domxml import parse_manifest
from nodeagent.downwardmetrics import DISK_SIZE, Metric, MetricsDiskError, read_disk
from nodeagent.host import SimulationRefused
from nodeagent.vmiref import VMIRef
from projections.cluster import ClusterState
from tests.nodeagent.helpers import (
    SPEC,
    WAIT_SECONDS,
    Cluster,
    next_report,
    owned,
    reported_domain,
    start,
)


async def test_an_agent_pays_for_its_first_launch_before_it_beats(cluster: Cluster,
                                                                 nats_url: str) -> None:
    """What a launch needs and loads on first use (kubernetes' quantity parser: half a
    second of CPU on the event loop, seconds on a busy host) is loaded at start, not at the
    first launch, where it held every agent's heartbeat up past a short grace."""
    _quantity_parser.cache_clear()
    running = await start(cluster, nats_url)
    try:
        assert _quantity_parser.cache_info().currsize == 1
    finally:
        await running.close()


async def test_restart_neither_loses_nor_duplicates_guests(
        cluster: Cluster, nats_url: str, conn: libvirt.virConnect) -> None:
    """`conn` keeps the test host alive between agents, as a real host outlives its agent
    (the test driver forgets its guests when its last connection closes)."""
    kept = await cluster.placed("kept")
    lost = await cluster.placed("lost")
    observed = DomainObservation(namespace=lost.namespace, name=lost.name, uid=lost.uid,
                                 phase="Running")
    await cluster.run("VirtualMachineInstance", "observe", "lost", msgspec.to_builtins(observed),
                      actor=node_actor(cluster.node))
    orphan = VMIRef(cluster.namespace, "orphan", str(uuid.uuid4()))
    reports = await cluster.nc.jetstream().pull_subscribe(
        cluster.layout.reports_filter, stream=cluster.layout.reports_stream)

    first = await start(cluster, nats_url)
    for ref in (kept, kept, orphan):
        await first.agent.work.execute(cluster.launch(ref), ref)
    assert owned(first.agent, cluster.namespace) == sorted([kept.uid, orphan.uid])
    await first.close()

    second = await start(cluster, nats_url, rediscovery_seconds=0.05)
    try:
        agent = second.agent
        assert owned(agent, cluster.namespace) == [kept.uid], "kept once, the orphan removed"
        assert agent.guests.ledger.holders() == {kept.uid}
        # What the launch took, from the VMI's spec: an emulated host has no /dev/kvm to
        # give, and the default pod interface needs one tun.
        assert agent.guests.ledger.in_use() == {KVM_DEVICE: 0, TUN_DEVICE: 1}
        assert list(agent.guests.domains.values()) == [kept]
        await next_report(reports, reported_domain("lost", DOMAIN_MISSING_REASON))
        await agent.work.execute(cluster.launch(kept), kept)
        assert owned(agent, cluster.namespace) == [kept.uid]

        agent.reporter.discovery = dataclasses.replace(agent.reporter.discovery, kvm_devices=7)
        changed = await next_report(reports, lambda r: bool(
            r.info and r.info["capacity"]["devices.kubevirt.io/kvm"] == "7"))
        assert changed.kind == "node"
    finally:
        lifecycle.graceful_stop(second.agent.host.conn, kept.domain, 0, second.agent.host.watcher)
        await second.close()


async def test_another_installations_guest_on_the_host_is_left_alone(
        cluster: Cluster, nats_url: str, conn: libvirt.virConnect) -> None:
    """Two installations (prefixes) sharing a host: neither adopts nor removes the other's
    guests, which its cluster never placed there, nor stops one that has a name of its own
    VMIs' (a stop for a VMI it never ran here destroyed and undefined the other's guest)."""
    ref = VMIRef(cluster.namespace, "theirs", str(uuid.uuid4()))
    vmi = cluster.launch(ref).vmi
    assert vmi is not None
    spec, ctx = parse_manifest(vmi, domain_type="test")
    dom = conn.defineXML(convert(spec, msgspec.structs.replace(ctx, installation="another")))
    dom.create()
    running = await start(cluster, nats_url)
    try:
        assert ref.domain not in running.agent.guests.domains
        assert conn.lookupByName(ref.domain).isActive(), "another installation's guest removed"
        stop = NodeCommand(event_id=str(uuid.uuid4()), verb="stop", namespace=ref.namespace,
                           name=ref.name, uid=ref.uid)
        await running.agent.work.execute(stop, ref)
        assert conn.lookupByName(ref.domain).isActive(), "another installation's guest stopped"
    finally:
        await running.close()
        dom.destroy()
        dom.undefine()


async def test_a_host_kept_in_a_file_outlives_its_agent(
        cluster: Cluster, nats_url: str, tmp_path: Path) -> None:
    """No connection keeps the test host alive here: the second agent finds the guest, paused
    as the first agent left it, in the `sim_state` file alone."""
    kept = await cluster.placed("kept")
    sim_state = str(tmp_path / "host.xml")
    first = await start(cluster, nats_url, sim_state=sim_state)
    await first.agent.work.execute(cluster.launch(kept), kept)
    pause = NodeCommand(event_id=str(uuid.uuid4()), verb="pause", namespace=kept.namespace,
                        name=kept.name, uid=kept.uid)
    await first.agent.work.execute(pause, kept)
    await first.close()

    second = await start(cluster, nats_url, sim_state=sim_state)
    try:
        [guest] = second.agent.guests.summaries()
        assert (guest.uid, guest.state) == (kept.uid, libvirt.VIR_DOMAIN_PAUSED)
        assert list(second.agent.guests.domains.values()) == [kept]
        assert kept.uid in second.agent.guests.ledger.holders()
    finally:
        await second.close()


@pytest.mark.parametrize("action", ["guest-shutdown", "guest-crash", "guest-io-error",
                                    "agent-stop", "agent-start"])
async def test_simulation_is_refused_on_a_real_hypervisor(action: str) -> None:
    agent = NodeAgent(AgentConfig(node="real", nats_url="nats://127.0.0.1:1",
                                  libvirt_uri="qemu:///system"))
    with pytest.raises(SimulationRefused, match="qemu:///system"):
        await agent.simulate(SimRequest(action=action, namespace="default", name="vm"))  # type: ignore[arg-type]
    assert agent.active.is_set()


async def test_a_stop_during_start_up_does_not_wait_for_the_read_service(
        nats_url: str, prefix: str) -> None:
    """No read service answers, so the start-up reconcile would wait 30 s for it; a stop
    (SIGTERM) in that time ends the agent at once, as virtbus up and the tests expect."""
    layout = Layout(prefix)
    nc = await nats.connect(nats_url)
    try:
        await ensure_all(nc.jetstream(), layout, 1)
        reports = await nc.jetstream().pull_subscribe(layout.reports_filter,
                                                      stream=layout.reports_stream)
        agent = NodeAgent(AgentConfig(node=f"node-{prefix}", nats_url=nats_url, prefix=prefix))
        stop = asyncio.Event()
        task = asyncio.ensure_future(agent.run(stop))
        await next_report(reports, lambda r: r.kind == "node")  # reported; now reconciling
        stop.set()
        await asyncio.wait_for(task, 5)
        assert not agent.started.is_set()
    finally:
        await nc.close()


METRICS_SPEC: dict[str, Any] = {
    "domain": {**SPEC["domain"],
               "devices": {"disks": [{"name": "metrics", "disk": {"bus": "virtio"}}]}},
    "volumes": [{"name": "metrics", "downwardMetrics": {}}]}


async def enable_downward_metrics(cluster: Cluster) -> None:
    """The DownwardMetrics gate on in the KubeVirt CR, as the HCO controller derives it from
    the HyperConverged, so the cluster admits a VMI with a downwardMetrics volume."""
    hco = {"apiVersion": hco_defaults.API_VERSION, "kind": hco_defaults.KIND,
           "metadata": {"name": hco_defaults.DEFAULT_NAME,
                        "namespace": hco_defaults.DEFAULT_NAMESPACE},
           "spec": {"featureGates": {"downwardMetrics": True}}}
    apply = Command(id=str(uuid.uuid4()), actor="user:test", kind=hco_defaults.KIND,
                    verb="apply", namespace=hco_defaults.DEFAULT_NAMESPACE,
                    name=hco_defaults.DEFAULT_NAME, manifest=hco)
    state = ClusterState()
    for sequence, event in (await cluster.writer.execute(apply)).events:
        state.apply(event, sequence)
    for command in HCOController().reconcile(state):
        result = await cluster.writer.execute(command)
        assert result.outcome.accepted, result.outcome.reason


def host_time(metrics: list[Metric]) -> int:
    [found] = [m.value for m in metrics if m.name == "Time"]
    return int(found)


async def metrics_on(disk: Path, done: Callable[[list[Metric]], bool]) -> list[Metric]:
    """The disk's metrics once `done` holds, read as a guest reads them: again when the
    disk is caught busy or mid-write."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        with contextlib.suppress(MetricsDiskError):
            found = read_disk(str(disk))
            if done(found):
                return found
        await asyncio.sleep(0.02)  # poll interval of a condition wait, not synchronisation
    raise AssertionError(f"{disk}: no such metrics in {WAIT_SECONDS} s")


async def test_a_downward_metrics_disk_is_written_at_launch_and_refreshed(
        cluster: Cluster, nats_url: str, conn: libvirt.virConnect, tmp_path: Path) -> None:
    """The launch creates the vhostmd disk where the converter attaches it; the agent then
    fills it with host and VM metrics and rewrites it (its Time moves on), again after a
    restart for the adopted guest, until the guest stops."""
    await enable_downward_metrics(cluster)
    ref = await cluster.placed("metrics", METRICS_SPEC)
    options = {"disk_dir": str(tmp_path), "downward_metrics_seconds": 0.05}
    disk = tmp_path / ref.namespace / ref.name / "metrics.img"

    first = await start(cluster, nats_url, **options)
    try:
        await first.agent.work.execute(cluster.launch(ref, METRICS_SPEC), ref)
        assert disk.stat().st_size == DISK_SIZE
        written = await metrics_on(disk, lambda m: any(x.context == "vm" for x in m))
        values = {(m.context, m.name): m.value for m in written}
        assert values["host", "HostName"] == cluster.node
        assert values["vm", "ResourceProcessorLimit"] == "1"
        assert values["vm", "PhysicalMemoryAllocatedToVirtualSystem"] == str(64 * 1024)
        await metrics_on(disk, lambda m: host_time(m) > host_time(written))
    finally:
        await first.close()

    left = host_time(read_disk(str(disk)))
    second = await start(cluster, nats_url, **options)
    try:
        assert second.agent.guests.metrics_disks == {ref.domain: (str(disk),)}
        await metrics_on(disk, lambda m: host_time(m) > left)
        stop = NodeCommand(event_id=str(uuid.uuid4()), verb="stop", namespace=ref.namespace,
                           name=ref.name, uid=ref.uid)
        await second.agent.work.execute(stop, ref)
        assert second.agent.guests.metrics_disks == {}
    finally:
        await second.close()


async def test_a_guest_agent_connecting_is_the_vmis_agentconnected_condition(
        cluster: Cluster) -> None:
    """What the agent reports of the guest agent's channel (`DomainObservation.
    agent_connected`) is KubeVirt's AgentConnected condition while it is open, and only
    while the guest runs; a report that does not say leaves it as it is."""
    ref = await cluster.placed("agented")

    async def observe(phase: str, connected: bool | None) -> list[str]:
        seen = DomainObservation(namespace=ref.namespace, name=ref.name, uid=ref.uid,
                                 phase=phase, agent_connected=connected)
        result = await cluster.run("VirtualMachineInstance", "observe", ref.name,
                                   msgspec.to_builtins(seen), actor=node_actor(cluster.node))
        answer = await ask(cluster.nc, cluster.layout, Query(
            kind="VirtualMachineInstance", namespace=ref.namespace, name=ref.name,
            after=result.events[-1][0] if result.events else 0), "user:test")
        return [c["type"] for c in answer.items[0]["status"]["conditions"]]

    assert "AgentConnected" not in await observe("Running", None)
    assert "AgentConnected" in await observe("Running", True)
    assert "AgentConnected" in await observe("Running", None)
    assert "AgentConnected" not in await observe("Running", False)
    assert "AgentConnected" in await observe("Running", True)
    assert "AgentConnected" not in await observe("Failed", True)


async def test_libvirts_echo_of_a_launch_is_not_reported_again(
        cluster: Cluster, nats_url: str, conn: libvirt.virConnect) -> None:
    """The launch reports Running; libvirt's started event, which the watcher sees around
    then, says nothing new, so the next report of the guest is the pause that follows
    (libvirt's events come in order: a repeat would come before it)."""
    ref = await cluster.placed("echoed")
    reports = await cluster.nc.jetstream().pull_subscribe(
        cluster.layout.reports_filter, stream=cluster.layout.reports_stream)
    running = await start(cluster, nats_url)
    try:
        await running.agent.work.execute(cluster.launch(ref), ref)
        pause = NodeCommand(event_id=str(uuid.uuid4()), verb="pause", namespace=ref.namespace,
                            name=ref.name, uid=ref.uid)
        await running.agent.work.execute(pause, ref)
        seen: list[tuple[str, str, bool]] = []
        deadline = time.monotonic() + WAIT_SECONDS
        while not (seen and seen[-1][2]) and time.monotonic() < deadline:
            try:
                msgs = await reports.fetch(16, timeout=1.0)
            except TimeoutError:
                continue
            for msg in msgs:
                await msg.ack()
                obs = msgspec.msgpack.decode(msg.data, type=NodeReport).domain
                if obs is not None and obs.uid == ref.uid:
                    seen.append((obs.phase, obs.reason, obs.paused))
        assert seen == [("Running", "launched", False), ("Running", "", True)]
    finally:
        lifecycle.graceful_stop(running.agent.host.conn, ref.domain, 0, running.agent.host.watcher)
        await running.close()
