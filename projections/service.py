"""The read-model service: folds the log into ClusterState and answers queries over NATS."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from events.aio import unless_stopped
from events.api.resources import ClusterTuning
from events.codec import Event
from events.connect import connect
from events.query import Answer, Query, query_subject
from events.streams import wait_for_streams
from events.subjects import Layout
from projections import http
from projections.cluster import ClusterState, render_node, render_vm, render_vmi
from projections.follower import follow, head
from projections.hco import ALERTS_QUERY, HCO_KINDS, METRICS_QUERY, answer, cluster_tuning
from projections.hco import render_view as render_hco_view
from projections.views import NodeView, View, VirtualMachineInstanceView, VirtualMachineView

log = structlog.get_logger(__name__)

READ_WAIT_SECONDS = 10.0


def render(state: ClusterState, query: Query) -> list[dict[str, Any]]:
    """The objects a query names, in KubeVirt's JSON shape, sorted by namespace and name."""
    out: list[dict[str, Any]] = []
    match query.kind:
        case "VirtualMachine":
            for vm in state.vms():
                meta = vm.metadata
                if _matches(query, meta.namespace, meta.name):
                    out.append(render_vm(vm, state.vmi(meta.namespace, meta.name)))
        case "VirtualMachineInstance":
            for vmi in state.vmis():
                meta = vmi.metadata
                if _matches(query, meta.namespace, meta.name):
                    out.append(render_vmi(vmi))
        case "Node":
            tuning = cluster_tuning(state)
            for node in state.nodes():
                if not query.name or node.name == query.name:
                    out.append(node_object(state, node, tuning))
        case kind if kind in HCO_KINDS:
            out = answer(state, kind, query.name, datetime.now(UTC))
        case kind if kind in (METRICS_QUERY, ALERTS_QUERY):
            return answer(state, kind, query.name, datetime.now(UTC))
    return sorted(out, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))


def node_object(state: ClusterState, node: NodeView,
                tuning: ClusterTuning | None = None) -> dict[str, Any]:
    """A Node with what its VMIs hold, counted as the scheduler counts it (with the cluster's
    tuning, which a caller rendering many nodes works out once)."""
    usage = state.node_usage(node.name, emulation=node.emulation,
                             tuning=tuning or cluster_tuning(state))
    return render_node(node, usage)


def render_view(state: ClusterState, view: View) -> dict[str, Any] | None:
    """Any one view in its API shape (what `watch` and `history` show); None once deleted."""
    if not view.exists:
        return None
    match view:
        case VirtualMachineView():
            meta = view.metadata
            return render_vm(view, state.vmi(meta.namespace, meta.name))
        case VirtualMachineInstanceView():
            return render_vmi(view)
        case NodeView():
            return node_object(state, view)
    return render_hco_view(state, view)


def _matches(query: Query, namespace: str, name: str) -> bool:
    return (not query.namespace or query.namespace == namespace) and (
        not query.name or query.name == name)


class ReadService:
    def __init__(self, nc: Client, layout: Layout) -> None:
        self.nc = nc
        self.layout = layout
        self.state = ClusterState()
        self.advanced = asyncio.Condition()
        self.answering: set[asyncio.Task[None]] = set()

    async def _on_event(self, sequence: int, event: Event) -> None:
        self.state.apply(event, sequence)
        async with self.advanced:
            self.advanced.notify_all()

    async def _on_skip(self, sequence: int, reason: str) -> None:
        """A message that is no event: counted, and read past (a query `after` it waits for
        nothing more)."""
        self.state.skip(sequence, reason)
        async with self.advanced:
            self.advanced.notify_all()

    async def _on_query(self, msg: Msg) -> None:
        """Answer each query in a task of its own: nats-py runs a subscription's callbacks
        one at a time, and a query waiting for the log to reach its `after` must not hold
        up the others."""
        task = asyncio.ensure_future(self._answer(msg))
        self.answering.add(task)
        task.add_done_callback(self.answering.discard)

    async def _answer(self, msg: Msg) -> None:
        try:
            query = msgspec.msgpack.decode(msg.data, type=Query)
            after = query.after
            if after > self.state.last_sequence:
                with contextlib.suppress(TimeoutError, NatsError):
                    after = await self._last_event_until(after)
            async with self.advanced:
                await asyncio.wait_for(self.advanced.wait_for(
                    lambda: self.state.last_sequence >= after), READ_WAIT_SECONDS)
            answer = Answer(items=render(self.state, query), sequence=self.state.last_sequence)
        except (msgspec.DecodeError, TimeoutError) as e:
            answer = Answer(error=f"{type(e).__name__}: {e}")
        await msg.respond(msgspec.msgpack.encode(answer))

    async def _last_event_until(self, after: int) -> int:
        """`after` names a stream position (the events stream's last sequence, as a node
        agent reads it); the messages there may be no event (a command's read guard,
        `<p>.guard`), so wait only for the newest event at or before it. A position the
        stream has not reached yet is waited for as it is."""
        info = await self.nc.jetstream().stream_info(self.layout.events_stream)
        if after > info.state.last_seq:
            return after
        return min(after, await head(self.nc, self.layout))

    async def run(self, stop: asyncio.Event, listen: tuple[str, int] | None = None) -> None:
        if not await unless_stopped(wait_for_streams(self.nc.jetstream(), self.layout), stop):
            return
        sub = await self.nc.subscribe(query_subject(self.layout), cb=self._on_query)
        server = await http.serve(self.state, render, *listen) if listen else None
        try:
            await follow(self.nc, self.layout, self._on_event, on_skip=self._on_skip,
                         stop=stop)
        finally:
            if server is not None:
                server.close()
            await sub.unsubscribe()
            for task in self.answering:
                task.cancel()


def run(nats_url: str, layout: Layout, listen: tuple[str, int] | None = None) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        nc = await connect(nats_url, f"{layout.prefix}-projections")
        log.info("read service started", nats_url=nats_url, prefix=layout.prefix)
        try:
            await ReadService(nc, layout).run(stop, listen)
        finally:
            await nc.close()

    asyncio.run(main())
