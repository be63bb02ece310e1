"""What the agent tests share: just enough of a control plane to place VMIs on a node and
make its work consumer, an agent started in-process on real NATS, and reading what it
reports."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.client import Client as Nats
from nats.js.client import JetStreamContext

from controlplane.controllers.dispatcher import WorkConsumers
from controlplane.writer import Writer
from events.language.messages import Command, DomainObservation, NodeCommand, NodeReport
from events.language.subjects import Layout
from nodeagent.agent import NodeAgent
from nodeagent.config import AgentConfig
from nodeagent.vmiref import VMIRef

WAIT_SECONDS = 20.0

SPEC: dict[str, Any] = {"domain": {"cpu": {"cores": 1}, "devices": {},
                                   "resources": {"requests": {"memory": "64Mi"}}}}


class Cluster:
    """Just enough of the control plane to place VMIs on a node: the writer, reads, and the
    node's work consumer (the agent only binds to it)."""

    def __init__(self, nc: Nats, writer: Writer, layout: Layout, node: str) -> None:
        self.nc, self.writer, self.layout, self.node = nc, writer, layout, node
        self.consumers = WorkConsumers(nc, layout)
        self.namespace = layout.prefix  # domain names stay unique on the shared test host

    async def run(self, kind: str, verb: str, name: str, manifest: dict[str, Any],
                  actor: str = "user:test") -> Any:
        command = Command(id=str(uuid.uuid4()), actor=actor, kind=kind, verb=verb,
                          namespace=self.namespace, name=name, manifest=manifest)
        result = await self.writer.execute(command)
        assert result.outcome.accepted, result.outcome.reason
        return result

    async def placed(self, name: str, spec: dict[str, Any] = SPEC) -> VMIRef:
        """A VMI scheduled to this node (no dispatcher runs, so nothing launches it)."""
        vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
               "metadata": {"name": name, "namespace": self.namespace}, "spec": spec}
        result = await self.run("VirtualMachineInstance", "apply", name, vmi)
        uid = str(result.events[0][1].uid)
        await self.run("VirtualMachineInstance", "schedule", name, {"node": self.node})
        return VMIRef(self.namespace, name, uid)

    def launch(self, ref: VMIRef, spec: dict[str, Any] = SPEC) -> NodeCommand:
        vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
               "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
               "spec": spec}
        return NodeCommand(event_id=str(uuid.uuid4()), verb="launch", namespace=ref.namespace,
                           name=ref.name, uid=ref.uid, vmi=vmi)


class Running:
    def __init__(self, agent: NodeAgent, task: asyncio.Future[None], stop: asyncio.Event) -> None:
        self.agent, self.task, self.stop = agent, task, stop

    async def close(self) -> None:
        self.stop.set()
        await self.task


async def start(cluster: Cluster, nats_url: str, **options: Any) -> Running:
    await cluster.consumers.ensure(cluster.node)  # as the control plane does on registration
    agent = NodeAgent(AgentConfig(node=cluster.node, nats_url=nats_url,
                                  prefix=cluster.layout.prefix, **options))
    stop = asyncio.Event()
    task = asyncio.ensure_future(agent.run(stop))
    started = asyncio.ensure_future(agent.started.wait())
    await asyncio.wait({started, task}, timeout=WAIT_SECONDS,
                       return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # the agent's own error, rather than a timeout
    assert started.done(), "the agent did not start"
    return Running(agent, task, stop)


def owned(agent: NodeAgent, namespace: str) -> list[str]:
    """uids of this test's guests on the shared host, as libvirt lists them now."""
    return sorted(d.uid for d in agent.guests.summaries() if d.name.startswith(f"{namespace}_"))


async def next_report(sub: JetStreamContext.PullSubscription,
                      match: Callable[[NodeReport], bool]) -> NodeReport:
    """The next report that `match`es, from the reports work queue (no one else reads it
    here)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            msgs = await sub.fetch(16, timeout=1.0)
        except TimeoutError:
            continue
        for msg in msgs:
            await msg.ack()
            report = msgspec.msgpack.decode(msg.data, type=NodeReport)
            if match(report):
                return report
    raise AssertionError("no matching report")


def reported_domain(name: str, reason: str) -> Callable[[NodeReport], bool]:
    def match(report: NodeReport) -> bool:
        obs: DomainObservation | None = report.domain
        return obs is not None and obs.name == name and obs.reason == reason

    return match
