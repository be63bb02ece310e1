"""The Python client: publish commands and await their outcome, read state (now or at any
point in the past), watch status streams, and read an object's audit history.

    async with await Client.connect("nats://127.0.0.1:4222") as vb:
        [outcome] = await vb.apply(manifest)
        vm = await vb.get("VirtualMachine", "default", "web", after=outcome.sequences[-1])
        async for change in vb.watch("VirtualMachine", "web", since=1):
            print(change.sequence, change.event.TYPE, change.object["status"])
"""

from __future__ import annotations

import asyncio
import getpass
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, Final, Self

import jsonpatch
import msgspec
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from controlplane.defaults import COMMAND_AWAIT_TIMEOUT_SECONDS
from controlplane.node_commands import LabelBody, TaintBody, TaintKey
from events.api.hco_defaults import KIND as HCO_API_KIND
from events.api.instancetype import CLUSTER_KINDS
from events.api.manifest import decode_object
from events.api.scheduling import Taint
from events.codec import Event
from events.connect import Access, connect, url_user
from events.directget import last_on, read_all, sequence
from events.errors import InvalidSpec, NotFound
from events.hco import HCO_KIND, OPERAND_TOKENS
from events.instancetype import KIND_TOKENS as INSTANCETYPE_TOKENS
from events.instancetype import REVISION_KIND, REVISION_TOKEN
from events.messages import (
    Command,
    Outcome,
    check_envelope,
    marker_aggregate,
    outcome_key,
    recorded_outcome,
)
from events.migration import MIGRATION_KIND
from events.nodes import NODE_KIND
from events.query import Query, ask
from events.subjects import DEFAULT_PREFIX, Layout, aggregate_id, split_aggregate_id
from events.transient import retry_within
from events.vm import VM_KIND, VMI_KIND
from projections.cluster import ClusterState
from projections.eviction import DrainProgress, drain_progress
from projections.follower import follow, read_event, start_sequence_at
from projections.service import render, render_view
from projections.snapshots import Snapshots, restore

KIND_TOKENS = {"VirtualMachine": VM_KIND, "VirtualMachineInstance": VMI_KIND, "Node": NODE_KIND,
               "VirtualMachineInstanceMigration": MIGRATION_KIND, HCO_API_KIND: HCO_KIND,
               **OPERAND_TOKENS, **INSTANCETYPE_TOKENS, REVISION_KIND: REVISION_TOKEN}
CLUSTER_SCOPED = frozenset({"Node", HCO_API_KIND, *OPERAND_TOKENS, *CLUSTER_KINDS})
"""Kinds whose aggregates are cluster-scoped: their namespace is not part of the id."""


_decode_outcome = msgspec.msgpack.Decoder(Outcome).decode

RETRY_WITHIN_SECONDS: Final = 20.0
"""How long a read, a command's publish or an outcome's look-up retries what NATS cannot do
now (a server of the cluster lost and the connection moved to another, a JetStream leader
being elected, the read service reconnecting) before the error is raised."""
RECONNECT_ATTEMPTS: Final = 3
"""Attempts per server, at connect and after a lost connection, before the client gives up."""
RECONNECT_WAIT_SECONDS: Final = 0.5
"""Between two attempts at one server: a person is waiting."""
OUTCOME_RECHECK_SECONDS: Final = 1.0
"""How often an awaited outcome checks whether the connection was re-established meanwhile
(an outcome published while it was down never arrives: it is read from the bucket then)."""


class CommandRejected(Exception):
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        where = f"{outcome.field}: " if outcome.field else ""
        super().__init__(f"{where}{outcome.reason}")


class Change(msgspec.Struct, frozen=True):
    """One step of a status stream: the event and the object as it stood after it."""

    sequence: int
    event: Event
    object: dict[str, Any] | None


class HistoryEntry(msgspec.Struct, frozen=True):
    sequence: int
    time: str
    actor: str
    type: str
    command_id: str
    correlation_id: str
    changes: list[dict[str, Any]]
    object: str = ""
    """The aggregate (`kind.namespace.name`), where entries span objects."""


async def _quiet(_error: Exception) -> None:
    """Connection errors surface as exceptions from `connect`; don't also print them."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: mappings merge recursively, `null` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def default_actor() -> str:
    return f"user:{getpass.getuser()}"


class Client:
    def __init__(self, nc: Nats, layout: Layout, actor: str) -> None:
        self.nc = nc
        self.layout = layout
        self.actor = actor
        self.js = nc.jetstream()
        self._outcomes: KeyValue | None = None

    @classmethod
    async def connect(cls, access: Access | str, prefix: str = DEFAULT_PREFIX,
                      actor: str = "") -> Self:
        # Reconnects (to another server of a cluster) when its server goes; a few attempts.
        nc = await connect(access, "virtbus-client", connect_timeout=5, allow_reconnect=True,
                           max_reconnect_attempts=RECONNECT_ATTEMPTS,
                           reconnect_time_wait=RECONNECT_WAIT_SECONDS, error_cb=_quiet)
        # Who logs in is who acts: a secured server lets a user command under its name only.
        user = access.user if isinstance(access, Access) else url_user(access)
        return cls(nc, Layout(prefix), actor or user or default_actor())

    async def close(self) -> None:
        await self.nc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- commands ----------------------------------------------------------------------

    def command(self, kind: str, verb: str, namespace: str = "", name: str = "",
                **fields: Any) -> Command:
        return Command(id=str(uuid.uuid4()), actor=self.actor, kind=kind, verb=verb,
                       namespace=namespace, name=name, **fields)

    async def submit(self, command: Command) -> bool:
        """Publish durably; whether the command stream already had it (a retried publish
        is harmless: the stream's dedupe, then the command's marker, answer it). A publish
        NATS cannot take now is sent again, for up to `RETRY_WITHIN_SECONDS`."""
        check_envelope(command)
        subject = self.layout.command_subject(command.actor, KIND_TOKENS.get(
            command.kind, command.kind.lower()), command.verb)
        ack = await retry_within(
            lambda: self.js.publish(subject, msgspec.msgpack.encode(command),
                                    headers={"Nats-Msg-Id": command.id}),
            "sending a command", RETRY_WITHIN_SECONDS, command_id=command.id)
        return bool(ack.duplicate)

    async def outcome(self, command_id: str,
                      timeout: float = COMMAND_AWAIT_TIMEOUT_SECONDS) -> Outcome:
        """The command's one outcome: already stored, or as soon as it is."""
        arrival, sub = await self._expect_outcome(command_id)
        try:
            return await self._settle(command_id, arrival, timeout, stored_first=True)
        finally:
            await sub.unsubscribe()

    async def run(self, command: Command, *, check: bool = True) -> Outcome:
        """Submit and await the one outcome; raise CommandRejected if `check` and refused.

        The outcome's arrival is subscribed to before the command is sent, on the outcome's
        own bucket subject: no watcher (a server-side consumer) per command."""
        arrival, sub = await self._expect_outcome(command.id)
        try:
            duplicate = await self.submit(command)
            outcome = await self._settle(command.id, arrival,
                                         COMMAND_AWAIT_TIMEOUT_SECONDS, stored_first=duplicate)
        finally:
            await sub.unsubscribe()
        if check and not outcome.accepted:
            raise CommandRejected(outcome)
        return outcome

    async def _expect_outcome(self, command_id: str) -> tuple[asyncio.Future[Msg], Any]:
        arrival: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        subject = f"$KV.{self.layout.outcomes_bucket}.{outcome_key(self.actor, command_id)}"
        sub = await self.nc.subscribe(subject, future=arrival, max_msgs=1)
        return arrival, sub

    async def _settle(self, command_id: str, arrival: asyncio.Future[Msg], timeout: float, *,
                      stored_first: bool) -> Outcome:
        if stored_first and (stored := await self._look_up(command_id)) is not None:
            return stored
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        reconnects = self.nc.stats["reconnects"]
        while True:
            try:
                msg = await asyncio.wait_for(asyncio.shield(arrival), min(
                    OUTCOME_RECHECK_SECONDS, max(deadline - loop.time(), 0.0)))
            except TimeoutError:
                if loop.time() < deadline and self.nc.stats["reconnects"] == reconnects:
                    continue
                reconnects = self.nc.stats["reconnects"]  # it may have come meanwhile
                stored = await self._look_up(command_id)
                if stored is not None:
                    return stored
                if loop.time() < deadline:
                    continue
                raise TimeoutError(f"no outcome for command {command_id} after {timeout:g}s;"
                                   f" it may still be decided: await it again by its id"
                                   ) from None
            return _decode_outcome(msg.data)

    async def _look_up(self, command_id: str) -> Outcome | None:
        return await retry_within(lambda: self._stored_outcome(command_id),
                                  "reading an outcome", RETRY_WITHIN_SECONDS,
                                  command_id=command_id)

    async def _stored_outcome(self, command_id: str) -> Outcome | None:
        """From the outcomes bucket, or, once its entry has expired, from the command's
        marker in the log (the record the bucket only delivers)."""
        if self._outcomes is None:  # bound once, not a STREAM.INFO round trip per look
            self._outcomes = await self.js.key_value(self.layout.outcomes_bucket)
        try:
            entry = await self._outcomes.get(outcome_key(self.actor, command_id))
        except KeyNotFoundError:
            entry = None
        if entry is not None and entry.value:
            return _decode_outcome(entry.value)
        marker = await last_on(self.nc, self.layout.events_stream,
                               self.layout.aggregate_subject(marker_aggregate(command_id)))
        event = read_event(marker) if marker is not None else None
        return recorded_outcome(event, sequence(marker)) if marker and event else None

    async def apply(self, *manifests: dict[str, Any], check: bool = True) -> list[Outcome]:
        """Validate every manifest locally first, so a bad document submits nothing."""
        for i, doc in enumerate(manifests):
            try:
                decode_object(doc)
            except InvalidSpec as e:
                raise InvalidSpec(f"document {i}: {e.field}" if len(manifests) > 1 else e.field,
                                  e.rule) from None
        return [await self.run(self.command(str(doc["kind"]), "apply", manifest=doc),
                               check=check) for doc in manifests]

    async def act(self, kind: str, verb: str, namespace: str, name: str,
                  **fields: Any) -> Outcome:
        return await self.run(self.command(kind, verb, namespace, name, **fields))

    async def label_node(self, name: str, labels: dict[str, str], remove: list[str],
                         *, overwrite: bool = False) -> Outcome:
        """kubectl label node: set `labels` (replacing others' values only with
        `overwrite`), remove the keys in `remove`; no events when nothing changes."""
        body = LabelBody(labels=labels, remove=remove, overwrite=overwrite)
        return await self.act("Node", "label", "", name, manifest=msgspec.to_builtins(body))

    async def taint_node(self, name: str, add: list[Taint], remove: list[TaintKey],
                         *, overwrite: bool = False) -> Outcome:
        """kubectl taint node: add taints (one per key and effect), remove by key[:effect]."""
        body = TaintBody(add=add, remove=remove, overwrite=overwrite)
        return await self.act("Node", "taint", "", name, manifest=msgspec.to_builtins(body))

    async def patch(self, kind: str, namespace: str, name: str,
                    patch: list[dict[str, Any]] | dict[str, Any]) -> Outcome:
        """kubectl patch, client side: the object as read, an RFC 6902 patch (a list) or an
        RFC 7386 merge patch (a mapping) applied to its metadata and spec, then `apply`."""
        obj = await self.get(kind, namespace, name)
        meta = obj["metadata"]
        current = {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                   "metadata": {key: meta[key] for key in ("name", "namespace", "labels",
                                                          "annotations") if key in meta},
                   "spec": obj.get("spec", {})}
        if isinstance(patch, list):
            patched: dict[str, Any] = jsonpatch.apply_patch(current, patch)
        else:
            patched = merge_patch(current, patch)
        [outcome] = await self.apply(patched)
        return outcome

    # -- reads -------------------------------------------------------------------------

    async def query(self, kind: str, namespace: str = "", name: str = "",
                    after: int = 0) -> list[dict[str, Any]]:
        query = Query(kind=kind, namespace=namespace, name=name, after=after)
        answer = await retry_within(lambda: ask(self.nc, self.layout, query, self.actor),
                                    "asking the read service", RETRY_WITHIN_SECONDS)
        if answer.error:
            raise RuntimeError(f"read service: {answer.error}")
        return answer.items

    async def get(self, kind: str, namespace: str, name: str, after: int = 0) -> dict[str, Any]:
        items = await self.query(kind, namespace, name, after)
        if not items:
            where = f"{namespace}/{name}" if namespace else name
            raise NotFound(f'{kind.lower()} "{where}" not found')
        return items[0]

    async def state_at(self, at: int | datetime) -> ClusterState:
        """The whole cluster as it stood at a sequence or an instant, rebuilt from the log."""
        stop = at if isinstance(at, int) else await start_sequence_at(self.nc, self.layout,
                                                                      at) - 1
        state = ClusterState()
        start = await restore(Snapshots(self.nc, self.layout), state, at_most=stop)
        for msg in await read_all(self.nc, self.layout.events_stream,
                                  self.layout.events_filter(), start=start, stop=stop):
            event = read_event(msg, on_skip=state.skip)  # one this version cannot read: None
            if event is not None:
                state.apply(event, sequence(msg))
        return state

    async def query_at(self, at: int | datetime, kind: str, namespace: str = "",
                       name: str = "") -> list[dict[str, Any]]:
        state = await self.state_at(at)
        return render(state, Query(kind=kind, namespace=namespace, name=name))

    async def watch(self, kind: str, namespace: str = "", name: str = "",
                    since: int | datetime | None = None) -> AsyncIterator[Change]:
        """Changes to matching objects: replayed from `since` (a sequence or a time), or
        from now when `since` is None, then live."""
        first = await self._first(since)
        state = ClusterState()
        start = await restore(Snapshots(self.nc, self.layout), state, at_most=first - 1)
        token = KIND_TOKENS[kind]
        queue: asyncio.Queue[Change] = asyncio.Queue()

        async def on_event(seq: int, event: Event) -> None:
            view = state.apply(event, seq)
            if seq < first or view is None:
                return
            view_kind, _, id_name = split_aggregate_id(event.originator_id)
            if view_kind != token:
                return
            meta = getattr(view, "metadata", None)
            obj_name = meta.name if meta is not None else id_name
            obj_ns = meta.namespace if meta is not None else ""
            if (name and obj_name != name) or (namespace and obj_ns != namespace):
                return
            await queue.put(Change(seq, event, render_view(state, view)))

        stop = asyncio.Event()
        task = asyncio.ensure_future(follow(self.nc, self.layout, on_event, start=start,
                                            stop=stop))
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                else:
                    getter.cancel()
                    task.result()
                    return
        finally:
            stop.set()
            await task

    async def drain_progress(self, node: str) -> AsyncIterator[DrainProgress]:
        """How a node's drain goes, from now (the log replayed up to its end first) until it
        is over: a new value each time what it still holds changes."""
        caught_up = int((await self.js.stream_info(self.layout.events_stream)).state.last_seq)
        state = ClusterState()
        queue: asyncio.Queue[DrainProgress] = asyncio.Queue()
        last: DrainProgress | None = None

        async def on_event(seq: int, event: Event) -> None:
            nonlocal last
            state.apply(event, seq)
            if seq < caught_up:
                return
            progress = drain_progress(state, node)
            if progress != last:
                last = progress
                await queue.put(progress)

        stop = asyncio.Event()
        task = asyncio.ensure_future(follow(self.nc, self.layout, on_event, stop=stop))
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    task.result()
                    return
                progress = getter.result()
                yield progress
                if progress.done:
                    return
        finally:
            stop.set()
            await task

    async def _first(self, since: int | datetime | None) -> int:
        if since is None:
            last = await self.js.stream_info(self.layout.events_stream)
            return int(last.state.last_seq) + 1
        if isinstance(since, int):
            return since
        return await start_sequence_at(self.nc, self.layout, since)

    async def correlated(self, correlation_id: str) -> list[HistoryEntry]:
        """Every event one request caused, across objects, in log order: a drain's cordon,
        its migrations and evictions, and their VMIs' moves. (A scan of the log.)"""
        msgs = await read_all(self.nc, self.layout.events_stream, self.layout.events_filter())
        out: list[HistoryEntry] = []
        for msg in msgs:
            event = read_event(msg)
            if event is None or event.correlation_id != correlation_id:
                continue
            out.append(HistoryEntry(
                sequence=sequence(msg), time=event.timestamp.isoformat(), actor=event.actor,
                type=event.TYPE, command_id=event.causation_id,
                correlation_id=event.correlation_id, changes=[],
                object=str(event.originator_id)))
        return out

    async def history(self, kind: str, namespace: str, name: str) -> list[HistoryEntry]:
        """Every event of one object, with who caused it and what changed (a JSON Patch of
        the object before and after)."""
        token = KIND_TOKENS[kind]
        agg = aggregate_id(token, "" if kind in CLUSTER_SCOPED else namespace, name)
        msgs = await read_all(self.nc, self.layout.events_stream,
                              self.layout.aggregate_subject(agg))
        if not msgs:
            raise NotFound(f'{kind.lower()} "{namespace}/{name}" has no history')
        state = ClusterState()
        before: dict[str, Any] = {}
        out: list[HistoryEntry] = []
        for msg in msgs:
            event = read_event(msg, on_skip=state.skip)  # one this version cannot read: None
            if event is None:
                continue
            view = state.apply(event, sequence(msg))
            if view is None:
                continue
            after = render_view(state, view) or {}
            after.get("metadata", {}).pop("resourceVersion", None)
            patch = jsonpatch.make_patch(before, after).patch
            out.append(HistoryEntry(
                sequence=sequence(msg), time=event.timestamp.isoformat(), actor=event.actor,
                type=event.TYPE, command_id=event.causation_id,
                correlation_id=event.correlation_id, changes=patch))
            before = after
        return out
