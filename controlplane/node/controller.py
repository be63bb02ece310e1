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

A beat is dated when the control plane takes it in, not by the agent's clock, and a node is
judged only at an instant up to which every beat put is taken in (`judgement_time`): a
control plane too busy to read its heartbeats (at 10,000 VMs its watch fell 40 s behind while
the agents beat on time) knows nothing about its nodes, and declares none lost.

Which lost nodes' VMIs are failed, and when, is their zones' call (`disruption`): one node
at a time at a rate per zone, none while every node is NotReady (kube's master disruption
mode), each after its VMIs' toleration of the node's NoExecute taint.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import structlog
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.kv import KeyValue

from controlplane.controllers import derived_command
from controlplane.defaults import (
    HEARTBEAT_READ_WAIT_SECONDS,
    LOST_NODE_TOLERATION_SECONDS,
    NODE_MONITOR_GRACE_SECONDS,
)
from controlplane.node.disruption import Evictions
from events.jetstream.transient import describe
from events.language.kinds.vm import NODE_UNRESPONSIVE
from events.language.messages import Command
from events.language.subjects import Layout, decode_token
from events.runtime.aio import unless_stopped
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
        """When each node's last beat was taken in."""
        self.started = time.monotonic()
        """Since when every node has its grace (the start, or a round that found the
        control plane had not run, or master disruption mode ending)."""
        self.evictions = Evictions()
        self._held: set[str] = set()
        """Lost nodes whose VMIs master disruption mode keeps (logged once each)."""
        self.read_revision = 0
        """The bucket's last revision the watch has taken in."""
        self._read_advanced = asyncio.Event()

    async def watch(self, stop: asyncio.Event) -> None:
        """Record when each node's heartbeat was taken in.

        A watch starts with the last value of every key, put at some time before: a node
        dead since then would look fresh, at each re-subscription (after NATS failed the
        watch) and at start. So only a value put after the watch began (a revision above
        the bucket's last when it began) is a beat; the replayed ones are not.

        Every entry queued is taken in one turn of the event loop (the watcher's iterator
        does not yield while it has some): one entry per turn fell behind 50 beats/s on a
        loop whose turns the controllers make long."""
        kv: KeyValue = await self.nc.jetstream().key_value(self.layout.heartbeats_bucket)
        replayed_up_to = (await kv.status()).stream_info.state.last_seq
        self._taken(replayed_up_to)
        watcher = await kv.watchall()
        try:
            await unless_stopped(self._take_in(watcher, replayed_up_to), stop)
        finally:
            await watcher.stop()

    async def _take_in(self, watcher: KeyValue.KeyWatcher, replayed_up_to: int) -> None:
        async for entry in watcher:
            if entry is None:  # the end of the replay
                continue
            revision = entry.revision or 0
            if entry.operation is None and revision > replayed_up_to:
                self.last_seen[decode_token(entry.key)] = time.monotonic()
            self._taken(revision)

    def _taken(self, revision: int) -> None:
        if revision > self.read_revision:
            self.read_revision = revision
            self._read_advanced.set()

    async def judgement_time(self, state: ClusterState) -> float | None:
        """The instant nodes may be judged at: one before which every beat put has been
        taken in, so a node silent then is silent, not unread. Now, when every node beat
        within the grace as far as the watch knows (nothing to confirm); else the moment
        the bucket's last revision was asked, once the watch has taken it in. None (one
        log line) when the watch is still behind after `HEARTBEAT_READ_WAIT_SECONDS`, or
        NATS cannot say: a control plane late reading its heartbeats learns nothing about
        its nodes from the silence."""
        asked = time.monotonic()
        if all(self.fresh(node.name, asked) for node in state.nodes()):
            return asked
        stream = f"KV_{self.layout.heartbeats_bucket}"
        try:
            last = (await self.nc.jetstream().stream_info(stream)).state.last_seq
        except (TimeoutError, NatsError) as e:
            log.warning("heartbeats' last revision unknown; no node judged this round",
                        error=describe(e))
            return None
        deadline = asked + HEARTBEAT_READ_WAIT_SECONDS
        while self.read_revision < last and time.monotonic() < deadline:
            self._read_advanced.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._read_advanced.wait(), deadline - time.monotonic())
        if self.read_revision < last:
            log.warning("heartbeats read late; no node judged this round",
                        revisions_behind=last - self.read_revision)
            return None
        return asked

    def heard(self, node: str, now: float) -> bool:
        """Whether `node` beat within the grace."""
        return now - self.last_seen.get(node, -math.inf) < self.grace

    def fresh(self, node: str, now: float) -> bool:
        """Whether `node` beat within the grace, or every node still has one (`started`)."""
        return now - max(self.last_seen.get(node, -math.inf), self.started) < self.grace

    def grant_grace(self, now: float) -> None:
        """Every node its grace again from `now`: no silent node is judged lost for it,
        and none is Ready again without a beat."""
        self.started = now

    def transitions(self, state: ClusterState, now: float) -> list[Command]:
        """Ready / NotReady transitions due at `now` (a `judgement_time`)."""
        commands: list[Command] = []
        for node in state.nodes():
            fresh = self.fresh(node.name, now)
            if node.ready and not fresh:
                log.warning("node silent for the grace; NotReady", node=node.name,
                            silent_s=round(now - self.last_seen.get(node.name, self.started), 1))
                commands.append(derived_command(NAME, "Node", "not-ready", "", node.name,
                                                node.version,
                                                manifest={"reason": "NodeStatusUnknown"}))
            elif not node.ready and self.heard(node.name, now):
                commands.append(derived_command(NAME, "Node", "ready", "", node.name,
                                                node.version))
        return commands

    def failures(self, state: ClusterState, now: float) -> list[Command]:
        """A fail for every active VMI of every node that is NotReady and still silent at
        `now` (a `judgement_time`) and whose zone let it go, each round until it is failed
        (see above)."""
        if self.evictions.observe(state.nodes(), now):
            self.grant_grace(now)
        commands: list[Command] = []
        for node in state.nodes():
            if node.ready or self.fresh(node.name, now):
                self._held.discard(node.name)
                continue
            if not self.evictions.due(node.name, now):
                self._log_held(state, node.name, now)
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

    def _log_held(self, state: ClusterState, node: str, now: float) -> None:
        """One line for a lost node whose VMIs would be failed by now, were not every node
        NotReady."""
        silent = now - max(self.last_seen.get(node, -math.inf), self.started)
        if (self.evictions.every_zone_disrupted and node not in self._held
                and silent >= self.grace + LOST_NODE_TOLERATION_SECONDS
                and state.vmis_on(node)):
            self._held.add(node)
            log.warning("VMIs of a lost node not failed: every node is NotReady (master "
                        "disruption mode)", node=node, silent_s=round(silent, 1))
