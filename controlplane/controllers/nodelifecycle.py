"""The node lifecycle controller: heartbeats in, Ready / NotReady transitions out.

Heartbeats are KV puts, not events; this controller watches them and appends a transition
only when a node crosses the grace period. When a node goes NotReady its active VMIs are
marked Failed (reason NodeUnresponsive), since nothing can vouch for them any more.
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
from events.subjects import Layout, decode_token, split_aggregate_id
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

    def check(self, state: ClusterState) -> list[Command]:
        """Transitions due now. A control plane that just started grants every node a grace."""
        now = time.monotonic()
        commands: list[Command] = []
        for node in state.nodes():
            _, _, name = split_aggregate_id(node.id)
            seen = self.last_seen.get(name, self.started)
            fresh = now - seen < self.grace
            if node.ready and not fresh:
                commands.append(derived_command(NAME, "Node", "not-ready", "", name, node.version,
                                                manifest={"reason": "NodeStatusUnknown"}))
                for vmi in state.vmis_on(name):
                    commands.append(derived_command(
                        NAME, "VirtualMachineInstance", "fail", vmi.metadata.namespace,
                        vmi.metadata.name, vmi.version, manifest={"reason": "NodeUnresponsive"}))
            elif not node.ready and fresh and name in self.last_seen:
                commands.append(derived_command(NAME, "Node", "ready", "", name, node.version))
        return commands
