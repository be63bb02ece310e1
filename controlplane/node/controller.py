"""The node lifecycle controller: heartbeats in, Ready / NotReady transitions out, and the
VMIs of a lost node failed.

Heartbeats are KV puts, not events; this controller watches them and appends a transition
only when a node crosses the grace period. The VMIs of a node that is NotReady and still
silent are failed (reason NodeUnresponsive), since nothing can vouch for them any more.

Failing them is level-triggered, as virt-controller's node controller re-checks an
unresponsive node every minute: every round asks for every active VMI of every such node,
not only on the round that made the node NotReady, so a control plane that died between
that append and the fails fails them once it runs again. Each fail's id is derived from the
VMI's version: the same VMI decided on again is the same command, applied once. A round
fails only what the log already shows on a NotReady node (the loop runs `transitions`
first and folds them in), so a VMI is never failed while its node still looks Ready to
the scheduler. One atomic append of the transition with the fails would not make this
simpler: a VMI placed on the node while it was decided would still need the next round.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from nats.aio.client import Client
from nats.js.kv import KeyValue

from controlplane.controllers import derived_command
from controlplane.defaults import NODE_MONITOR_GRACE_SECONDS
from events.messages import Command
from events.subjects import Layout, decode_token
from events.vm import NODE_UNRESPONSIVE
from projections.cluster import ClusterState

log = structlog.get_logger(__name__)

NAME = "node-lifecycle"


class NodeLifecycle:
    def __init__(self, nc: Client, layout: Layout,
                 grace_seconds: float = NODE_MONITOR_GRACE_SECONDS) -> None:
        self.nc = nc
        self.layout = layout
        self.grace = grace_seconds
        self.last_seen: dict[str, float] = {}
        self.started = time.monotonic()

    async def watch(self, stop: asyncio.Event) -> None:
        """Record when each node's heartbeat was last put.

        A watch starts with the last value of every key, put at some time before: a node
        dead since then would look fresh, at each re-subscription (after NATS failed the
        watch) and at start. So only a value put after the watch began (a revision above
        the bucket's last when it began) is a beat; the replayed ones are not."""
        kv: KeyValue = await self.nc.jetstream().key_value(self.layout.heartbeats_bucket)
        replayed_up_to = (await kv.status()).stream_info.state.last_seq
        watcher = await kv.watchall()
        try:
            while not stop.is_set():
                try:
                    entry = await watcher.updates(timeout=1.0)
                except TimeoutError:
                    continue
                if (entry is not None and entry.operation is None
                        and (entry.revision or 0) > replayed_up_to):
                    self.last_seen[decode_token(entry.key)] = time.monotonic()
        finally:
            await watcher.stop()

    def fresh(self, node: str, now: float) -> bool:
        """Whether `node` beat within the grace; a control plane that just started grants
        every node a grace."""
        return now - self.last_seen.get(node, self.started) < self.grace

    def transitions(self, state: ClusterState) -> list[Command]:
        """Ready / NotReady transitions due now."""
        now = time.monotonic()
        commands: list[Command] = []
        for node in state.nodes():
            fresh = self.fresh(node.name, now)
            if node.ready and not fresh:
                commands.append(derived_command(NAME, "Node", "not-ready", "", node.name,
                                                node.version,
                                                manifest={"reason": "NodeStatusUnknown"}))
            elif not node.ready and fresh and node.name in self.last_seen:
                commands.append(derived_command(NAME, "Node", "ready", "", node.name,
                                                node.version))
        return commands

    def failures(self, state: ClusterState) -> list[Command]:
        """A fail for every active VMI of every node that is NotReady and still silent,
        each round until it is failed (see above)."""
        now = time.monotonic()
        commands: list[Command] = []
        for node in state.nodes():
            if node.ready or self.fresh(node.name, now):
                continue
            for vmi in state.vmis_on(node.name):
                meta = vmi.metadata
                log.info("failing a VMI of an unresponsive node", node=node.name,
                         vmi=meta.name, namespace=meta.namespace, uid=vmi.uid)
                commands.append(derived_command(
                    NAME, "VirtualMachineInstance", "fail", meta.namespace, meta.name,
                    vmi.version, manifest={"reason": NODE_UNRESPONSIVE},
                    correlation_id=node.correlation_id))
        return commands
