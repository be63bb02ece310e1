"""A VMI KubeVirt admits but no virtbus node can run as written, through the agent's own
queue on real NATS and the shared `test:///default` host: its launch defines no domain and
is reported Failed with a reason that names the field and why (the VMI's status.reason)."""

from __future__ import annotations

from typing import Any

from events.language.messages import NodeReport
from nodeagent.phases import GuestPhase
from tests.nodeagent.helpers import SPEC, Cluster, next_report, owned, start
from tests.nodeagent.test_work import publish, worked_through

SRIOV_SPEC: dict[str, Any] = {
    **SPEC,
    "domain": {**SPEC["domain"], "devices": {"interfaces": [{"name": "fast", "sriov": {}}]}},
    "networks": [{"name": "fast", "multus": {"networkName": "sriov-net"}}],
}


async def test_an_sriov_vmi_fails_its_launch_saying_why(cluster: Cluster, nats_url: str) -> None:
    ref = await cluster.placed("sriov", SRIOV_SPEC)
    reports = await cluster.nc.jetstream().pull_subscribe(
        cluster.layout.reports_filter, stream=cluster.layout.reports_stream)
    running = await start(cluster, nats_url)
    try:
        await worked_through(cluster, running,
                             await publish(cluster, cluster.launch(ref, SRIOV_SPEC)))

        def failed(report: NodeReport) -> bool:
            return report.domain is not None and report.domain.uid == ref.uid \
                and report.domain.phase == GuestPhase.FAILED

        report = await next_report(reports, failed)
        assert report.domain is not None
        assert report.domain.reason == (
            "launch failed: spec.domain.devices.interfaces[0].sriov: this node has no "
            "SR-IOV virtual function for interface 'fast'")
        assert owned(running.agent, cluster.namespace) == []
    finally:
        await running.close()
