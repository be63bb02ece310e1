"""A node's report of a guest's interfaces, folded by the control plane into the VMI's
`status.interfaces` (KubeVirt's shape), on a real nats-server; what the report may not say
is refused naming the field."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from controlplane.intake import report_command
from controlplane.writer import Writer
from events.api.vm import VirtualMachineInstanceNetworkInterface
from events.jetstream.streams import ensure_all
from events.language.messages import InterfacesObservation, NodeReport, Outcome, node_actor
from events.language.query import Query, ask
from events.language.subjects import Layout
from nodeagent.vmiref import VMIRef
from projections.service import ReadService
from tests.nodeagent.helpers import Cluster

MAC = "52:54:00:12:34:56"


@pytest.fixture
async def cluster(nats_url: str, prefix: str) -> AsyncIterator[Cluster]:
    layout = Layout(prefix)
    nc = await nats.connect(nats_url)
    await ensure_all(nc.jetstream(), layout, 1)
    stop = asyncio.Event()
    reads = asyncio.ensure_future(ReadService(nc, layout).run(stop))
    try:
        yield Cluster(nc, Writer(nc, layout), layout, "node-1")
    finally:
        stop.set()
        await reads
        await nc.close()


def nic(ip: str = "", *, first: str | None = None) -> VirtualMachineInstanceNetworkInterface:
    return VirtualMachineInstanceNetworkInterface(
        name="default", mac=MAC, ip_address=ip if first is None else first,
        ip_addresses=[ip] if ip else [], info_source="domain")


async def report(cluster: Cluster, ref: VMIRef, *nics: VirtualMachineInstanceNetworkInterface,
                 node: str = "node-1", uid: str = "") -> Outcome:
    seen = InterfacesObservation(namespace=ref.namespace, name=ref.name, uid=uid or ref.uid,
                                 interfaces=list(nics))
    command = report_command(NodeReport(id=str(uuid.uuid4()), node=node, kind="interfaces",
                                        interfaces=seen))
    assert command is not None
    return (await cluster.writer.execute(command)).outcome


async def status(cluster: Cluster, name: str) -> dict[str, Any]:
    info = await cluster.nc.jetstream().stream_info(cluster.layout.events_stream)
    answer = await ask(cluster.nc, cluster.layout,
                       Query(kind="VirtualMachineInstance", namespace=cluster.namespace,
                             name=name, after=info.state.last_seq), node_actor(cluster.node))
    found: dict[str, Any] = answer.items[0]["status"]
    return found


async def test_reported_interfaces_are_the_vmis_status_interfaces(cluster: Cluster) -> None:
    ref = await cluster.placed("web")
    assert "interfaces" not in await status(cluster, "web")
    assert (await report(cluster, ref, nic())).sequences  # the MAC, before any lease
    assert (await status(cluster, "web"))["interfaces"] == [
        {"name": "default", "mac": MAC, "infoSource": "domain"}]
    changed = await report(cluster, ref, nic("10.0.2.2"))
    assert changed.accepted and changed.sequences
    assert (await status(cluster, "web"))["interfaces"] == [
        {"name": "default", "mac": MAC, "ipAddress": "10.0.2.2", "ipAddresses": ["10.0.2.2"],
         "infoSource": "domain"}]
    same = await report(cluster, ref, nic("10.0.2.2"))
    assert same.accepted and not same.sequences, "an unchanged report appends nothing"


@pytest.mark.parametrize(("nics", "field", "rule"), [
    ([nic("10.0.2.300")], "manifest.interfaces[0].ipAddresses[0]", "is not an IP address"),
    ([nic("10.0.2.2", first="10.0.2.9")], "manifest.interfaces[0].ipAddress",
     "must be the first of ipAddresses"),
])
async def test_a_report_with_bad_addresses_is_refused_naming_the_field(
        cluster: Cluster, nics: list[VirtualMachineInstanceNetworkInterface], field: str,
        rule: str) -> None:
    ref = await cluster.placed("web")
    refused = await report(cluster, ref, *nics)
    assert not refused.accepted
    assert (refused.field, rule in refused.reason) == (field, True)
    assert "interfaces" not in await status(cluster, "web")


async def test_only_the_vmis_node_reports_its_running_instance(cluster: Cluster) -> None:
    ref = await cluster.placed("web")
    other = await report(cluster, ref, nic("10.0.2.2"), node="node-2")
    assert (other.accepted, other.field) == (False, "node")
    stale = await report(cluster, ref, nic("10.0.2.2"), uid=str(uuid.uuid4()))
    assert (stale.accepted, stale.reason) == (False, "stale report: no such VMI instance")
    await cluster.run("VirtualMachineInstance", "observe", "web", {
        "namespace": ref.namespace, "name": ref.name, "uid": ref.uid, "phase": "Failed",
        "gone": True}, actor=node_actor(cluster.node))
    late = await report(cluster, ref, nic("10.0.2.2"))
    assert not late.accepted and "finished" in late.reason
    assert "interfaces" not in await status(cluster, "web")
