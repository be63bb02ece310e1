"""The read-model service: folds the log into ClusterState and answers queries over NATS."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from prometheus_client import CollectorRegistry, Counter, generate_latest

from events.aio import unless_stopped
from events.api.resources import ClusterTuning
from events.codec import Event
from events.connect import Access, connect_unless_stopped, shown
from events.messages import NODE_ACTOR_PREFIX
from events.policy import Policy, Request, resource_of
from events.query import Answer, Query, queries_filter, query_asker
from events.streams import wait_for_streams
from events.subjects import Layout
from projections import http, vm_metrics
from projections.cluster import (
    ClusterState,
    outdated_launcher,
    render_node,
    render_vm,
    render_vmi,
)
from projections.follower import follow, head
from projections.hco import ALERTS_QUERY, HCO_KINDS, METRICS_QUERY, answer, cluster_tuning
from projections.hco import render_view as render_hco_view
from projections.instancetype import INSTANCETYPE_KINDS, ControllerRevisionView, InstancetypeView
from projections.instancetype import of_kind as instancetype_objects
from projections.instancetype import render as render_instancetype
from projections.migration import MigrationView, render_migration
from projections.snapshots import Snapshots, keep_writing, restore
from projections.views import NodeView, View, VirtualMachineInstanceView, VirtualMachineView

log = structlog.get_logger(__name__)

READ_WAIT_SECONDS = 10.0

REPLY_PREFIXES: Final = ("_INBOX.", "_R_.")
"""Where an answer may go: a requester's inbox (`events.connect.inbox_prefix` gives every
role one under `_INBOX.`), or a reply the server mapped through a service import (`_R_.`,
which no client may name itself). Anything else could be a stream's subject, and an answer
there would be stored, by the read service's hand, in the log."""
QUERIES_REFUSED: Final = "virtbus_read_queries_refused"
"""Counter (Prometheus adds `_total`) of queries left unanswered, by `reason`."""
NO_REPLY: Final = "no_reply"
NOT_AN_INBOX: Final = "reply_not_an_inbox"


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
                    out.append(render_vmi(vmi, outdated=outdated_launcher(state, vmi)))
        case "VirtualMachineInstanceMigration":
            for migration in state.migrations():
                meta = migration.metadata
                if _matches(query, meta.namespace, meta.name):
                    out.append(migration_object(state, migration))
        case "Node":
            tuning = cluster_tuning(state)
            for node in state.nodes():
                if not query.name or node.name == query.name:
                    out.append(node_object(state, node, tuning))
        case kind if kind in HCO_KINDS:
            out = answer(state, kind, query.name, datetime.now(UTC))
        case kind if kind in INSTANCETYPE_KINDS:
            out = [render_instancetype(view) for view in
                   instancetype_objects(state.views.values(), kind)
                   if _matches(query, view.metadata.namespace, view.metadata.name)]
        case kind if kind == METRICS_QUERY:
            [hco] = answer(state, kind, query.name, datetime.now(UTC))
            return [{"text": hco["text"] + vm_metrics.exposition(state).decode()}]
        case kind if kind == ALERTS_QUERY:
            return answer(state, kind, query.name, datetime.now(UTC))
    return sorted(out, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))


def node_object(state: ClusterState, node: NodeView,
                tuning: ClusterTuning | None = None) -> dict[str, Any]:
    """A Node with what its VMIs hold, counted as the scheduler counts it (with the cluster's
    tuning, which a caller rendering many nodes works out once)."""
    usage = state.node_usage(node.name, emulation=node.emulation,
                             tuning=tuning or cluster_tuning(state))
    return render_node(node, usage)


def migration_object(state: ClusterState, migration: MigrationView) -> dict[str, Any]:
    """A migration with its VMI's migrationState, when the VMI's last migration is this."""
    vmi = state.vmi(migration.metadata.namespace, migration.vmi_name)
    return render_migration(migration, vmi.migration if vmi is not None else None)


def render_view(state: ClusterState, view: View) -> dict[str, Any] | None:
    """Any one view in its API shape (what `watch` and `history` show); None once deleted."""
    if not view.exists:
        return None
    match view:
        case VirtualMachineView():
            meta = view.metadata
            return render_vm(view, state.vmi(meta.namespace, meta.name))
        case VirtualMachineInstanceView():
            return render_vmi(view, outdated=outdated_launcher(state, view))
        case NodeView():
            return node_object(state, view)
        case MigrationView():
            return migration_object(state, view)
        case InstancetypeView() | ControllerRevisionView():
            return render_instancetype(view)
    return render_hco_view(state, view)


ANONYMOUS: Final = "system:anonymous"
"""Who asks over HTTP (no authentication there): what Kubernetes calls an unauthenticated
request. With a policy, the HTTP API shows only what the policy grants this user."""
REDACTED: Final = "<redacted>"
NODE_READABLE_KINDS: Final = ("KubeVirt",)
"""What a node agent reads besides its own VMIs: the cluster's KubeVirt configuration (CPU
models, feature gates), as virt-handler reads the KubeVirt CR."""
SECRET_FIELDS: Final = ("userData", "userDataBase64", "networkData", "networkDataBase64")
"""Cloud-init fields that may hold passwords and keys."""


def visible(policy: Policy, asker: str, query: Query,
            items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What of `items` `asker` may see: a node agent its own node's VMIs only; anyone else
    what the policy lets it get (one object) or list, namespace by namespace. Cloud-init
    secrets are shown only to who may change the object (and so could read them back by
    writing them); a viewer or a node sees `<redacted>`; a node also reads the KubeVirt
    configuration. Metrics and alerts are counts over
    the cluster, served to all as Prometheus scrapes them."""
    if query.kind in (METRICS_QUERY, ALERTS_QUERY):
        return items
    if asker.startswith(NODE_ACTOR_PREFIX):
        if query.kind in NODE_READABLE_KINDS:
            return items
        node = asker.removeprefix(NODE_ACTOR_PREFIX)
        return [_redacted(item) for item in items
                if query.kind == "VirtualMachineInstance"
                and item.get("status", {}).get("nodeName") == node]
    group, resource = resource_of(query.kind)
    verb = "get" if query.name else "list"
    out = []
    for item in items:
        namespace = item.get("metadata", {}).get("namespace", "")
        if not policy.allows(asker, Request(verb, group, resource, namespace)):
            continue
        writer = policy.allows(asker, Request("patch", group, resource, namespace))
        out.append(item if writer else _redacted(item))
    return out


def _redacted(item: dict[str, Any]) -> dict[str, Any]:
    """`item` with its cloud-init secrets replaced, in place: `render` builds every answer
    afresh (`msgspec.to_builtins`), so no read model shares it."""
    spec = item.get("spec", {})
    for owner in (spec, spec.get("template", {}).get("spec", {})):
        for source in _secret_sources(owner):
            for field in SECRET_FIELDS:
                if field in source:
                    source[field] = REDACTED
    return item


def _secret_sources(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [v[key] for v in spec.get("volumes", []) if isinstance(v, dict)
            for key in ("cloudInitNoCloud", "cloudInitConfigDrive")
            if isinstance(v.get(key), dict)]


def _matches(query: Query, namespace: str, name: str) -> bool:
    return (not query.namespace or query.namespace == namespace) and (
        not query.name or query.name == name)


class ReadService:
    def __init__(self, nc: Client, layout: Layout, policy: Policy | None = None) -> None:
        self.nc = nc
        self.layout = layout
        self.policy = policy or Policy.open()
        self.state = ClusterState()
        self.advanced = asyncio.Condition()
        self.answering: set[asyncio.Task[None]] = set()
        self.registry = CollectorRegistry()
        self.refused = Counter(QUERIES_REFUSED, "Queries the read service did not answer",
                               ["reason"], registry=self.registry)

    def render(self, state: ClusterState, query: Query,
               asker: str = ANONYMOUS) -> list[dict[str, Any]]:
        """`render`, as `asker` may see it."""
        return visible(self.policy, asker, query, render(state, query))

    def process_metrics(self) -> bytes:
        """This process's own counters, for `/metrics` (not functions of the log)."""
        return generate_latest(self.registry)

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
        up the others. A query whose reply is no inbox is refused unanswered (see
        `REPLY_PREFIXES`): counted, and logged with the subject it named."""
        if not msg.reply.startswith(REPLY_PREFIXES):
            reason = NOT_AN_INBOX if msg.reply else NO_REPLY
            self.refused.labels(reason).inc()
            log.warning("refused a query: its reply subject is not an inbox",
                        reply=msg.reply, subject=msg.subject, reason=reason)
            return
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
            answer = Answer(items=self.render(self.state, query,
                                              query_asker(self.layout, msg.subject)),
                            sequence=self.state.last_sequence)
        except (msgspec.DecodeError, TimeoutError) as e:
            answer = Answer(error=f"{type(e).__name__}: {e}")
        await msg.respond(msgspec.msgpack.encode(answer))

    async def listen(self) -> Subscription:
        """Start answering queries (on what the state holds, as it advances)."""
        return await self.nc.subscribe(queries_filter(self.layout), cb=self._on_query)

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
        snapshots = Snapshots(self.nc, self.layout)
        start = await restore(snapshots, self.state)
        writing = asyncio.ensure_future(keep_writing(snapshots, self.state, stop))
        sub = await self.listen()
        server = (await http.serve(self.state, self.render, *listen, self.process_metrics)
                  if listen else None)
        try:
            await follow(self.nc, self.layout, self._on_event, start=start,
                         on_skip=self._on_skip, stop=stop)
        finally:
            writing.cancel()
            if server is not None:
                await server.cleanup()
            await sub.unsubscribe()
            for task in self.answering:
                task.cancel()


def run(access: Access, layout: Layout, listen: tuple[str, int] | None = None,
        policy: Policy | None = None) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        nc = await connect_unless_stopped(access, f"{layout.prefix}-projections", stop)
        if nc is None:
            return
        log.info("read service started", nats_url=shown(access.url), prefix=layout.prefix,
                 authorization="policy" if policy is not None and policy.enforced else "open")
        try:
            await ReadService(nc, layout, policy).run(stop, listen)
        finally:
            await nc.close()

    asyncio.run(main())
