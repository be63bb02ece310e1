"""The Python client: publish commands and await their outcome, read state (now or at any
point in the past), watch status streams, and read an object's audit history.

    async with await Client.connect("nats://127.0.0.1:4222") as vb:
        [outcome] = await vb.apply(manifest)
        vm = await vb.get("VirtualMachine", "default", "web", after=outcome.sequences[-1])
        async for change in vb.watch("VirtualMachine", "default", "web", since=1):
            print(change.sequence, change.type, change.object["status"])

Every read goes through the read service, which answers as this client's user may see it
(`projections.service.PolicySight`): the same for an operator as for a person limited to
one namespace, who may not read the event log itself.
"""

from __future__ import annotations

import asyncio
import getpass
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, Final, Self, TypeVar

import msgspec
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from controlplane.defaults import COMMAND_AWAIT_TIMEOUT_SECONDS
from events.api.errors import Forbidden, InvalidSpec, NotFound, TooManyRequests
from events.api.kinds import token_of
from events.api.manifest import decode_object
from events.api.node import LabelBody, TaintBody, TaintKey
from events.api.patch import PatchBody
from events.api.replicaset import REPLICA_SET, ScaleBody
from events.api.scheduling import Taint
from events.jetstream.connect import Access, connect, url_user
from events.jetstream.directget import read_all
from events.jetstream.requests import js_publish
from events.jetstream.transient import retry_within
from events.language.codec import Event
from events.language.ids import random_uuid
from events.language.messages import (
    Command,
    Outcome,
    check_envelope,
    marker_aggregate,
    outcome_key,
)
from events.language.query import (
    FORBIDDEN,
    NOT_FOUND,
    TOO_MANY_REQUESTS,
    Answer,
    Change,
    ConsoleAnswer,
    ConsoleQuery,
    HistoryAnswer,
    HistoryEntry,
    HistoryQuery,
    Query,
    Verb,
    WatchAnswer,
    WatchQuery,
    ask_verb,
)
from events.language.subjects import DEFAULT_PREFIX, Layout, encode_token
from projections.cluster import ClusterState
from projections.eviction import DrainProgress, drain_progress
from projections.follower import first_outcome, follow
from projections.kinds.vm import TERMINAL_PHASES

__all__ = ["Change", "Client", "CommandRejected", "HistoryEntry"]

A = TypeVar("A", Answer, HistoryAnswer, WatchAnswer, ConsoleAnswer)

_decode_outcome = msgspec.msgpack.Decoder(Outcome).decode

RETRY_WITHIN_SECONDS: Final = 20.0
"""How long a read, a command's publish or an outcome's look-up retries what NATS cannot do
now (a server of the cluster lost and the connection moved to another, a JetStream leader
being elected, the read service reconnecting) before the error is raised."""
PUBLISH_TIMEOUT_SECONDS: Final = 5.0
"""One try at a command's publish awaits the stream's ack this long (nats-py's default)."""
CONSOLE_FOLLOW_SECONDS: Final = 0.5
"""How often a followed console asks for more (the agent publishes twice a second)."""
DRAIN_POLL_SECONDS: Final = 1.0
"""How often `drain_progress` reads what the log gained: a person creates no consumer, so it
polls by Direct Get."""
RECONNECT_ATTEMPTS: Final = 3
"""Attempts per server, at connect and after a lost connection, before the client gives up."""
RECONNECT_WAIT_SECONDS: Final = 0.5
"""Between two attempts at one server: a person is waiting."""
OUTCOME_RECHECK_SECONDS: Final = 1.0
"""How often the client checks whether its connection was re-established meanwhile: an
outcome published while it was down never arrives, so every outcome still awaited is read
from the bucket then."""
LAST_LOOK_UP_SECONDS: Final = 5.0
"""How long a look-up of a stored outcome may take past the caller's timeout (once, at the
deadline), or after a reconnect: a person who may not read the log asks for a marker the
server never answers (10 s a try), and must still hear of the timeout at once."""
NOT_AN_ANNOUNCEMENT: Final = ("Nats-Sequence", "Status", "KV-Operation")
"""Headers of what reaches an outcome's subject without being the control plane's put: a
stored message sent there as a reply (a Direct Get aimed at it), a status, a delete."""


class CommandRejected(Exception):
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        where = f"{outcome.field}: " if outcome.field else ""
        super().__init__(f"{where}{outcome.reason}")


def outcomes_bucket(js: JetStreamContext, layout: Layout) -> KeyValue:
    """The outcomes bucket, read by Direct Get of one's own keys, bound as nats-py's
    `key_value` would bind it but without asking for the stream's info: a person may not,
    since a STREAM.INFO request's body (`subjects_filter`), which no permission sees, lists
    every key, every other user's command ids among them."""
    bucket = layout.outcomes_bucket
    return KeyValue(name=bucket, stream=f"KV_{bucket}", pre=f"$KV.{bucket}.", js=js,
                    direct=True)


def _arrived(arrivals: list[asyncio.Future[Outcome]], outcome: Outcome) -> None:
    """Hand `outcome` to every caller still awaiting it."""
    for arrival in arrivals:
        if not arrival.done():
            arrival.set_result(outcome)


async def _quiet(_error: Exception) -> None:
    """Connection errors surface as exceptions from `connect`; don't also print them."""


def default_actor() -> str:
    return f"user:{getpass.getuser()}"


class Client:
    def __init__(self, nc: Nats, layout: Layout, actor: str) -> None:
        self.nc = nc
        self.layout = layout
        self.actor = actor
        self.js = nc.jetstream()
        self._outcomes: KeyValue | None = None
        self._outcome_sub: Any = None
        self._awaited: dict[str, tuple[str, list[asyncio.Future[Outcome]]]] = {}
        """Outcomes awaited (command id, each caller's arrival), by their bucket subject:
        one subscription serves them all."""
        self._rechecking: asyncio.Future[None] | None = None

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
        """Close the connection; whoever still awaits an outcome hears so at once."""
        if self._rechecking is not None:
            self._rechecking.cancel()
        for _command_id, arrivals in self._awaited.values():
            for arrival in arrivals:
                if not arrival.done():
                    arrival.set_exception(ConnectionClosedError())
        await self.nc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- commands ----------------------------------------------------------------------

    def command(self, kind: str, verb: str, namespace: str = "", name: str = "",
                **fields: Any) -> Command:
        return Command(id=random_uuid(), actor=self.actor, kind=kind, verb=verb,
                       namespace=namespace, name=name, **fields)

    async def submit(self, command: Command) -> bool:
        """Publish durably; whether the command stream already had it (a retried publish
        is harmless: the stream's dedupe, then the command's marker, answer it). A publish
        NATS cannot take now is sent again, for up to `RETRY_WITHIN_SECONDS`."""
        check_envelope(command)
        subject = self.layout.command_subject(command.actor, token_of(command.kind),
                                             command.verb)
        ack = await retry_within(
            lambda: js_publish(self.nc, subject, msgspec.msgpack.encode(command),
                               headers={"Nats-Msg-Id": command.id},
                               timeout=PUBLISH_TIMEOUT_SECONDS),
            "sending a command", RETRY_WITHIN_SECONDS, command_id=command.id)
        return bool(ack.duplicate)

    async def outcome(self, command_id: str,
                      timeout: float = COMMAND_AWAIT_TIMEOUT_SECONDS) -> Outcome:
        """The command's one outcome: already stored, or as soon as it is."""
        subject, arrival = await self._expect_outcome(command_id)
        try:
            return await self._settle(command_id, arrival, timeout, stored_first=True)
        finally:
            self._forget(subject, arrival)

    async def run(self, command: Command, *, check: bool = True,
                  timeout: float = COMMAND_AWAIT_TIMEOUT_SECONDS) -> Outcome:
        """Submit and await the one outcome; raise CommandRejected if `check` and refused.

        The outcome's arrival is expected before the command is sent, on the outcome's own
        bucket subject: no watcher (a server-side consumer) per command, and no subscription
        either (`_expect_outcome`)."""
        subject, arrival = await self._expect_outcome(command.id)
        try:
            duplicate = await self.submit(command)
            outcome = await self._settle(command.id, arrival, timeout, stored_first=duplicate)
        finally:
            self._forget(subject, arrival)
        if check and not outcome.accepted:
            raise CommandRejected(outcome)
        return outcome

    async def _expect_outcome(self, command_id: str) -> tuple[str, asyncio.Future[Outcome]]:
        """(the outcome's bucket subject, its arrival): the client's one subscription to its
        own outcomes (`<actor>.*`, what its user may read) hands each to whoever awaits it,
        and nothing to anyone else. A SUB and an UNSUB per command cost the client and the
        server more than the command's own publish."""
        bucket = f"$KV.{self.layout.outcomes_bucket}"
        if self._outcome_sub is None:
            self._outcome_sub = await self.nc.subscribe(
                f"{bucket}.{encode_token(self.actor)}.*", cb=self._outcome_arrived)
            self._rechecking = asyncio.ensure_future(self._recheck_after_reconnects())
        arrival: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        subject = f"{bucket}.{outcome_key(self.actor, command_id)}"
        self._awaited.setdefault(subject, (command_id, []))[1].append(arrival)
        return subject, arrival

    def _forget(self, subject: str, arrival: asyncio.Future[Outcome]) -> None:
        """One caller no longer awaits: others awaiting the same command still do."""
        awaited = self._awaited.get(subject)
        if awaited is not None:
            awaited[1].remove(arrival)
            if not awaited[1]:
                del self._awaited[subject]

    async def _outcome_arrived(self, msg: Msg) -> None:
        """Only the control plane may publish on these subjects, but a reply may be aimed
        at one (a Direct Get of one's own outcome, answered there): what is not this
        command's outcome, as the control plane put it, is ignored."""
        awaited = self._awaited.get(msg.subject)
        if awaited is None or (msg.headers and any(h in msg.headers
                                                   for h in NOT_AN_ANNOUNCEMENT)):
            return
        try:
            outcome = _decode_outcome(msg.data)
        except msgspec.DecodeError:  # no outcome: the bucket is read at the deadline
            return
        if outcome.command_id != awaited[0]:
            return
        _arrived(awaited[1], outcome)

    async def _recheck_after_reconnects(self) -> None:
        """After each reconnect, every outcome still awaited is read from the bucket, once:
        one check a second for the whole client, where each awaiting command woke every
        second (thousands of timers when many are in flight)."""
        seen = self.nc.stats["reconnects"]
        while not self.nc.is_closed:
            await asyncio.sleep(OUTCOME_RECHECK_SECONDS)  # a poll of the counter
            if self.nc.stats["reconnects"] == seen:
                continue
            seen = self.nc.stats["reconnects"]
            for command_id, arrivals in list(self._awaited.values()):
                if all(arrival.done() for arrival in arrivals):
                    continue
                stored = await self._look_up_within(command_id, LAST_LOOK_UP_SECONDS)
                if stored is not None:
                    _arrived(arrivals, stored)

    async def _settle(self, command_id: str, arrival: asyncio.Future[Outcome],
                      timeout: float, *, stored_first: bool) -> Outcome:
        """The outcome, within `timeout` (and one bounded look-up past it): as it arrives,
        or as stored, looked up first when it may be stored already, and at the deadline,
        when it may have come unannounced."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if stored_first:
            looking = asyncio.ensure_future(self._look_up(command_id))
            try:
                await asyncio.wait((looking, arrival), timeout=timeout,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                looking.cancel()
            if not arrival.done() and looking.done() and not looking.cancelled() \
                    and looking.exception() is None and (stored := looking.result()):
                return stored
        try:
            return await asyncio.wait_for(arrival, max(0.0, deadline - loop.time()))
        except TimeoutError:
            stored = await self._look_up_within(command_id, LAST_LOOK_UP_SECONDS)
            if stored is not None:
                return stored
            raise TimeoutError(f"no outcome for command {command_id} after {timeout:g}s;"
                               f" it may still be decided: await it again by its id"
                               ) from None

    async def _look_up_within(self, command_id: str, seconds: float) -> Outcome | None:
        """A look-up that fails, or takes longer than `seconds`, finds nothing."""
        try:
            return await asyncio.wait_for(self._look_up(command_id), seconds)
        except Exception:  # the caller raises its own clear error, or waits on
            return None

    async def _look_up(self, command_id: str) -> Outcome | None:
        return await retry_within(lambda: self._stored_outcome(command_id),
                                  "reading an outcome", RETRY_WITHIN_SECONDS,
                                  command_id=command_id)

    async def _stored_outcome(self, command_id: str) -> Outcome | None:
        """From the outcomes bucket, or, once its entry has expired, from the command's
        marker in the log (the record the bucket only delivers)."""
        if self._outcomes is None:  # bound without a STREAM.INFO (`outcomes_bucket`)
            self._outcomes = outcomes_bucket(self.js, self.layout)
        try:
            entry = await self._outcomes.get(outcome_key(self.actor, command_id))
        except KeyNotFoundError:
            entry = None
        if entry is not None and entry.value:
            return _decode_outcome(entry.value)
        found = first_outcome(await read_all(
            self.nc, self.layout.events_stream,
            self.layout.aggregate_subject(marker_aggregate(command_id))))
        return found[0] if found is not None else None

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

    async def scale(self, namespace: str, name: str, replicas: int) -> Outcome:
        """kubectl scale vmirs: set a replica set's `spec.replicas`."""
        body = ScaleBody(replicas=replicas)
        return await self.act(REPLICA_SET, "scale", namespace, name,
                              manifest=msgspec.to_builtins(body))

    async def patch(self, kind: str, namespace: str, name: str,
                    patch: list[dict[str, Any]] | dict[str, Any], *,
                    resource_version: str = "", overwrite: bool = True) -> Outcome:
        """kubectl patch, decided by the control plane against the object as it is then (this
        client reads nothing): an RFC 6902 patch (a list) or an RFC 7386 merge patch (a
        mapping), the result admitted as an `apply`. `resource_version`: refused if the object
        changed since that sequence; without `overwrite`, a merge patch may not replace a
        value set to another."""
        body = PatchBody(type="json" if isinstance(patch, list) else "merge", patch=patch,
                         resource_version=resource_version, overwrite=overwrite)
        return await self.act(kind, "patch", namespace, name,
                              manifest=msgspec.to_builtins(body))

    # -- reads -------------------------------------------------------------------------

    async def _ask(self, verb: Verb, query: msgspec.Struct, answer: type[A]) -> A:
        """The read service's answer; its refusal raised (`Forbidden` for the policy's). An
        audit read refused for its rate is asked again when the answer says, as client-go
        does on a 429, while the waits add up to no more than `RETRY_WITHIN_SECONDS`."""
        waited = 0
        while True:
            got = await retry_within(
                lambda: ask_verb(self.nc, self.layout, self.actor, verb, query, answer=answer),
                "asking the read service", RETRY_WITHIN_SECONDS)
            if got.reason != TOO_MANY_REQUESTS:
                break
            waited += got.retry_after_seconds
            if waited > RETRY_WITHIN_SECONDS:
                raise TooManyRequests(got.error, got.retry_after_seconds)
            await asyncio.sleep(got.retry_after_seconds)
        if got.reason == FORBIDDEN:
            raise Forbidden(got.error)
        if got.reason == NOT_FOUND:
            raise NotFound(got.error)
        if got.error:
            raise RuntimeError(f"read service: {got.error}")
        return got

    async def query(self, kind: str, namespace: str = "", name: str = "",
                    after: int = 0) -> list[dict[str, Any]]:
        return await self._listed(Query(kind=kind, namespace=namespace, name=name,
                                        after=after))

    async def get(self, kind: str, namespace: str, name: str, after: int = 0) -> dict[str, Any]:
        items = await self.query(kind, namespace, name, after)
        if not items:
            where = f"{namespace}/{name}" if namespace else name
            raise NotFound(f'{kind.lower()} "{where}" not found')
        return items[0]

    async def query_at(self, at: int | datetime, kind: str, namespace: str = "",
                       name: str = "") -> list[dict[str, Any]]:
        """Objects as they stood at a sequence or an instant (the read service rebuilds them
        from the log)."""
        return await self._listed(Query(kind=kind, namespace=namespace, name=name, at=at))

    async def _listed(self, query: Query) -> list[dict[str, Any]]:
        """Every page of a `get` answer (a list too large for one message comes in pages,
        all of one state: `projections.paging`)."""
        items: list[dict[str, Any]] = []
        while True:
            answer = await self._ask("get", query, Answer)
            items += answer.items
            if not answer.continue_:
                return items
            query = msgspec.structs.replace(query, continue_=answer.continue_)

    async def watch(self, kind: str, namespace: str = "", name: str = "",
                    since: int | datetime | None = None) -> AsyncIterator[Change]:
        """Changes to matching objects: replayed from `since` (a sequence or a time), or
        from now when `since` is None, then live: page after page, each starting where the
        last ended, so none is missed or shown twice."""
        position: int | datetime | None = since
        while True:
            page = await self._ask("watch", WatchQuery(kind=kind, namespace=namespace,
                                                       name=name, since=position), WatchAnswer)
            for change in page.changes:
                yield change
            position = page.next

    async def console(self, namespace: str, name: str, *,
                      follow: bool = False) -> AsyncIterator[bytes]:
        """The VMI's serial console output (its current instance's), as the guest wrote it:
        what is kept, then, with `follow`, what comes, until the VMI is finished. Refused
        (`Forbidden`) unless the policy grants `get` of `virtualmachineinstances/console`;
        `NotFound` for a VMI that is not there or runs on no node."""
        since = 0
        while True:
            page = await self._ask("console", ConsoleQuery(namespace=namespace, name=name,
                                                           since=since), ConsoleAnswer)
            if page.output:
                yield page.output
            since = page.next
            if page.more:
                continue
            if not follow or page.phase in TERMINAL_PHASES:
                return
            await asyncio.sleep(CONSOLE_FOLLOW_SECONDS)  # the poll period of a follower

    async def drain_progress(self, node: str) -> AsyncIterator[DrainProgress]:
        """How a node's drain goes, from now (the log replayed up to its end first) until it
        is over: a new value each time what it still holds changes. It reads the log
        directly, by Direct Get: who may drain (patch nodes) is a cluster-wide operator."""
        state = ClusterState()
        queue: asyncio.Queue[DrainProgress] = asyncio.Queue()
        last: DrainProgress | None = None
        live = False

        async def report() -> None:
            nonlocal last
            progress = drain_progress(state, node)
            if progress != last:
                last = progress
                await queue.put(progress)

        async def on_event(seq: int, event: Event) -> None:
            state.apply(event, seq)
            if live:
                await report()

        async def on_caught_up() -> None:
            # The log's end may be a message no reader folds (a read guard): report where
            # the replay ended, not at its last event.
            nonlocal live
            live = True
            await report()

        stop = asyncio.Event()
        task = asyncio.ensure_future(follow(self.nc, self.layout, on_event,
                                            on_caught_up=on_caught_up, stop=stop,
                                            poll_seconds=DRAIN_POLL_SECONDS))
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

    async def correlated(self, correlation_id: str) -> list[HistoryEntry]:
        """Every event one request caused, across the objects this user may read, in log
        order: a drain's cordon, its migrations and evictions, and their VMIs' moves."""
        query = HistoryQuery(correlation=correlation_id)
        return (await self._ask("history", query, HistoryAnswer)).entries

    async def history(self, kind: str, namespace: str, name: str) -> list[HistoryEntry]:
        """Every event of one object, with who caused it and what changed (a JSON Patch of
        the object before and after, cloud-init secrets redacted unless this user may
        change the object)."""
        query = HistoryQuery(kind=kind, namespace=namespace, name=name)
        entries = (await self._ask("history", query, HistoryAnswer)).entries
        if not entries:
            raise NotFound(f'{kind.lower()} "{namespace}/{name}" has no history')
        return entries
