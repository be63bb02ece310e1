"""The read-model service: folds the log into ClusterState and answers queries over NATS."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
from datetime import datetime
from typing import Any, Final, cast

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from prometheus_client import CollectorRegistry, Counter, generate_latest

from events.api.kinds import is_cluster_scoped, kind_named
from events.api.names import NODE_ACTOR_PREFIX
from events.authorization.policy import PathRequest, Policy, Request, resource_of
from events.jetstream.connect import Access, connect_unless_stopped, shown
from events.jetstream.streams import wait_for_streams
from events.language.codec import Event
from events.language.query import (
    FORBIDDEN,
    NOT_FOUND,
    TOO_MANY_REQUESTS,
    Answer,
    ConsoleAnswer,
    ConsoleQuery,
    HistoryAnswer,
    HistoryQuery,
    Query,
    WatchAnswer,
    WatchQuery,
    queries_filter,
    query_asker,
)
from events.language.subjects import Layout
from events.runtime.aio import report_loop_errors, unless_stopped
from events.runtime.collector import tune_for_service
from projections import audit, http
from projections.bulk import uncollected
from projections.cluster import ClusterState
from projections.console import ConsoleRefused, console_page
from projections.follower import follow, head, start_sequence_at
from projections.hco import ALERTS_QUERY, METRICS_QUERY
from projections.http import ANONYMOUS, METRICS_PATH, StaticTokens
from projections.paging import PAGE_SHARE, Listed, ListPages, parse_continue
from projections.ratelimit import AskerLimits, AuditLimit
from projections.rendering import render
from projections.snapshots import Snapshots, keep_writing, restore

log = structlog.get_logger(__name__)

READ_WAIT_SECONDS = 10.0

REPLY_PREFIXES: Final = ("_INBOX.", "_R_.")
"""Where an answer may go: a requester's inbox (`events.jetstream.connect.inbox_prefix` gives every
role one under `_INBOX.`), or a reply the server mapped through a service import (`_R_.`,
which no client may name itself). Anything else could be a stream's subject, and an answer
there would be stored, by the read service's hand, in the log."""
QUERIES_REFUSED: Final = "virtbus_read_queries_refused"
"""Counter (Prometheus adds `_total`) of queries left unanswered, by `reason`."""
NO_REPLY: Final = "no_reply"
NOT_AN_INBOX: Final = "reply_not_an_inbox"
MALFORMED: Final = "malformed"
"""A query that does not decode, names no kind the read side serves, or no such verb."""
FORBIDDEN_REASON: Final = "forbidden"
"""A query naming what the policy does not let the asker read."""
NO_CONSOLE: Final = "no_console"
"""A console query naming a VMI that is not there, or that runs on no node."""
RATE_LIMITED: Final = "rate_limited"
"""An audit read past the asker's rate (`projections.ratelimit`)."""
STATUS_REASONS: Final = {FORBIDDEN_REASON: FORBIDDEN, RATE_LIMITED: TOO_MANY_REQUESTS,
                          NO_CONSOLE: NOT_FOUND}
"""A refusal's Kubernetes Status reason, told to the asker in the answer."""
TOO_MANY_REQUESTS_MESSAGE: Final = "Too many requests, please try again later."
"""kube-apiserver's words for a 429."""
WATCH_WAIT_SECONDS: Final = 5.0
"""How long a `watch` page waits for a first change before it answers with none: under the
asker's request timeout (`events.language.query.QUERY_TIMEOUT_SECONDS`)."""


REDACTED: Final = "<redacted>"
NODE_READABLE_KINDS: Final = ("KubeVirt",)
"""What a node agent reads besides its own VMIs: the cluster's KubeVirt configuration (CPU
models, feature gates), as virt-handler reads the KubeVirt CR."""
SECRET_FIELDS: Final = ("userData", "userDataBase64", "networkData", "networkDataBase64")
"""Cloud-init fields that may hold passwords and keys."""


class PolicySight:
    """What one asker may see of one kind with one verb (`audit.Sight`): objects in the
    namespaces the policy lets it `verb` them, cloud-init secrets only where it may also
    change them (and so could read them back by writing them); elsewhere `<redacted>`. A
    cluster-scoped kind's objects (the HyperConverged and its operands among them, whatever
    namespace they show) are seen at the cluster scope, as their commands are decided."""

    def __init__(self, policy: Policy, asker: str, kind: str, verb: str) -> None:
        self.policy, self.asker, self.verb = policy, asker, verb
        self.group, self.resource = resource_of(kind)
        self.cluster_scoped = is_cluster_scoped(kind)

    def request(self, namespace: str) -> Request:
        return Request(self.verb, self.group, self.resource,
                       "" if self.cluster_scoped else namespace)

    def may_read(self, namespace: str) -> bool:
        return self.policy.allows(self.asker, self.request(namespace))

    def show(self, item: dict[str, Any]) -> dict[str, Any] | None:
        namespace = item.get("metadata", {}).get("namespace", "")
        if not self.may_read(namespace):
            return None
        writer = self.policy.allows(self.asker, Request(
            "patch", self.group, self.resource, "" if self.cluster_scoped else namespace))
        return item if writer else _redacted(item)


def visible(policy: Policy, asker: str, query: Query,
            items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What of `items` `asker` may see: a node agent its own node's VMIs only (secrets
    redacted) and the KubeVirt configuration; anyone else what its `PolicySight` of a `get`
    (one object) or `list` shows. Metrics (to whoever may get `/metrics`: `_get`) and alerts
    are over the whole cluster, as Prometheus scrapes them."""
    if query.kind in (METRICS_QUERY, ALERTS_QUERY):
        return items
    if asker.startswith(NODE_ACTOR_PREFIX):
        if query.kind in NODE_READABLE_KINDS:
            return items
        node = asker.removeprefix(NODE_ACTOR_PREFIX)
        return [_redacted(item) for item in items
                if query.kind == "VirtualMachineInstance"
                and item.get("status", {}).get("nodeName") == node]
    sight = PolicySight(policy, asker, query.kind, "get" if query.name else "list")
    return [shown for item in items if (shown := sight.show(item)) is not None]


class Refused(Exception):
    """A query the read service answers with an error, counted by `reason` and logged."""

    def __init__(self, reason: str, message: str, retry_after_seconds: int = 0) -> None:
        self.reason = reason
        self.retry_after_seconds = retry_after_seconds
        super().__init__(message)


def _forbid(sight: PolicySight, namespace: str) -> None:
    """Refuse a query naming a namespace (or a cluster-scoped object) the asker may not
    read: Kubernetes' Forbidden, not an empty answer that looks like nothing there."""
    if not sight.may_read(namespace):
        raise Refused(FORBIDDEN_REASON,
                      f"forbidden: User {sight.asker!r} {sight.request(namespace)}")


def _served_kind(kind: str) -> str:
    if kind_named(kind) is None:
        raise Refused(MALFORMED, f"kind: no such kind {kind[:64]!r}")
    return kind


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


class ReadService:
    def __init__(self, nc: Client, layout: Layout, policy: Policy | None = None,
                 tokens: StaticTokens | None = None,
                 audit_limit: AuditLimit | None = None, *,
                 trust_proxy_headers: bool = False, page_bytes: int = 0) -> None:
        self.nc = nc
        self.layout = layout
        self.policy = policy or Policy.open()
        self.tokens = tokens
        self.trust_proxy_headers = trust_proxy_headers
        self.audit_limits = AskerLimits(audit_limit or AuditLimit())
        self.pages = ListPages()
        self.page_bytes = page_bytes
        """The most a `get` page's items may take, in bytes; 0: `PAGE_SHARE` of the
        server's `max_payload`."""
        self.state = ClusterState()
        self.advanced = asyncio.Condition()
        self.answering: set[asyncio.Task[None]] = set()
        self.registry = CollectorRegistry()
        self.refused = Counter(QUERIES_REFUSED, "Queries the read service did not answer",
                               ["reason"], registry=self.registry)

    def render(self, state: ClusterState, query: Query,
               asker: str = ANONYMOUS) -> list[dict[str, Any]]:
        """`render`, as `asker` may see it."""
        with uncollected():
            return visible(self.policy, asker, query, render(state, query))

    def refuse(self, reason: str, **detail: str) -> None:
        """A query or HTTP request refused: counted by `reason`, and logged."""
        self.refused.labels(reason).inc()
        log.warning("refused a read", reason=reason, **detail)

    def process_metrics(self) -> bytes:
        """This process's own counters, for `/metrics` (not functions of the log)."""
        return generate_latest(self.registry)

    async def listed_at(self, sequence: int, query: Query, asker: str) -> Listed:
        """An HTTP list's page no longer kept: the list rebuilt at its sequence, an audit
        read (`http.TooManyRequests` past the asker's bucket, counted and logged)."""
        try:
            self._audit_read(asker)
        except Refused as e:
            self.refuse(e.reason, asker=asker, verb="http list", error=str(e))
            raise http.TooManyRequests(e.retry_after_seconds) from None
        listed, _ = await self._rebuilt(sequence, query, asker)
        return listed

    def sight(self, asker: str, kind: str, verb: str) -> PolicySight:
        """What `asker` may see of `kind` with `verb` (an HTTP watch's objects)."""
        return PolicySight(self.policy, asker, kind, verb)

    async def folded_past(self, sequence: int, timeout: float) -> int:
        """The read model's last sequence once it is past `sequence`, or after `timeout`."""
        with contextlib.suppress(TimeoutError):
            await self._advanced_to(sequence + 1, timeout)
        return self.state.last_sequence

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
            self.refuse(NOT_AN_INBOX if msg.reply else NO_REPLY, reply=msg.reply,
                        subject=msg.subject)
            return
        task = asyncio.ensure_future(self._answer(msg))
        self.answering.add(task)
        task.add_done_callback(self.answering.discard)

    async def _answer(self, msg: Msg) -> None:
        """Decode by verb, answer as the asker may see it; anything refused is an answer
        with `error` (and `reason` `FORBIDDEN` for the policy's refusals, `TOO_MANY_REQUESTS`
        past the asker's audit reads), counted and logged, never a crash."""
        asker, verb = query_asker(self.layout, msg.subject)
        answer_type: type[Answer | HistoryAnswer | WatchAnswer | ConsoleAnswer] = Answer
        try:
            match verb:
                case "get":
                    answer: Answer | HistoryAnswer | WatchAnswer | ConsoleAnswer = \
                        await self._get(asker, msgspec.msgpack.decode(msg.data, type=Query))
                case "history":
                    answer_type = HistoryAnswer
                    answer = await self._history(
                        asker, msgspec.msgpack.decode(msg.data, type=HistoryQuery))
                case "watch":
                    answer_type = WatchAnswer
                    answer = await self._watch(
                        asker, msgspec.msgpack.decode(msg.data, type=WatchQuery))
                case "console":
                    answer_type = ConsoleAnswer
                    answer = await self._console(
                        asker, msgspec.msgpack.decode(msg.data, type=ConsoleQuery))
                case _:
                    raise Refused(MALFORMED, f"no such query verb {verb[:32]!r}")
        except (msgspec.DecodeError, Refused) as e:
            refused = e if isinstance(e, Refused) else Refused(MALFORMED,
                                                               f"{type(e).__name__}: {e}")
            self.refuse(refused.reason, asker=asker, verb=verb, error=str(refused))
            answer = answer_type(error=str(refused), reason=STATUS_REASONS.get(refused.reason, ""),
                                 retry_after_seconds=refused.retry_after_seconds)
        except (TimeoutError, NatsError) as e:
            answer = answer_type(error=f"{type(e).__name__}: {e}")
        await msg.respond(msgspec.msgpack.encode(answer))

    def _audit_read(self, asker: str) -> None:
        """Take one of `asker`'s audit reads (each replays the log); refuse it as
        kube-apiserver refuses a request past its limit when there is none left."""
        wait = self.audit_limits.take(asker)
        if wait:
            raise Refused(RATE_LIMITED, TOO_MANY_REQUESTS_MESSAGE, math.ceil(wait))

    async def _get(self, asker: str, query: Query) -> Answer:
        """Now (once the state holds `after`), or `at` a point, rebuilt from the log; a page
        at a time, each cut from the first page's list (`projections.paging`). A rebuild
        (`at`, or a further page no longer kept) is an audit read."""
        if query.kind == METRICS_QUERY and not self.policy.allows(
                asker, access := PathRequest("get", METRICS_PATH)):  # as over HTTP: its
            # series name every namespace's VMs
            raise Refused(FORBIDDEN_REASON, f"forbidden: User {asker!r} {access}")
        try:
            continued = parse_continue(query.continue_)
        except ValueError as e:
            raise Refused(MALFORMED, str(e)) from None
        key = (asker, query.kind, query.namespace, query.name, query.node, query.at is None)
        listed = None if continued is None else self.pages.get(key, continued.sequence)
        rebuild_at = continued.sequence if continued is not None else query.at
        if listed is None and rebuild_at is not None:
            self._audit_read(asker)
        if query.namespace and not asker.startswith(NODE_ACTOR_PREFIX):
            _forbid(PolicySight(self.policy, asker, query.kind,
                                "get" if query.name else "list"), query.namespace)
        if continued is not None and listed is not None:
            sequence = continued.sequence
        elif rebuild_at is not None:
            listed, sequence = await self._rebuilt(rebuild_at, query, asker)
        else:
            after = query.after
            if after > self.state.last_sequence:
                with contextlib.suppress(TimeoutError, NatsError):
                    after = await self._last_event_until(after)
            await self._advanced_to(after, READ_WAIT_SECONDS)
            listed = self._listed(self.state, query, asker)
            sequence = self.state.last_sequence
        items, token = self.pages.page(
            key, sequence, listed, continued.offset if continued is not None else 0,
            budget=self.page_bytes or int(self.nc.max_payload * PAGE_SHARE))
        # Items encoded already: msgspec writes a Raw as its bytes, the asker decodes dicts.
        return Answer(items=cast(list[dict[str, Any]], items), sequence=sequence,
                      continue_=token)

    def _listed(self, state: ClusterState, query: Query, asker: str) -> Listed:
        return Listed.of(self.render(state, query, asker))

    async def _rebuilt(self, at: int | datetime, query: Query,
                       asker: str) -> tuple[Listed, int]:
        """The list `query` names as it stood `at`, and the sequence it stands at. One
        uncollected scope from the snapshot's decode to the encoded list, the state dropped
        inside it: the collector comes back to nothing of it to walk (a 10,000-VM state
        and its rendering are some 200,000 containers)."""
        with uncollected():
            state = await audit.state_at(self.nc, self.layout, at, query)
            listed = await asyncio.to_thread(  # its own state: off the live loop
                self._listed, state, query, asker)
            sequence = state.last_sequence
            del state
        return listed, sequence

    async def _advanced_to(self, sequence: int, timeout: float) -> None:
        """Until the state has read `sequence`; TimeoutError after `timeout`."""
        async with self.advanced:
            await asyncio.wait_for(self.advanced.wait_for(
                lambda: self.state.last_sequence >= sequence), timeout)

    async def _history(self, asker: str, query: HistoryQuery) -> HistoryAnswer:
        self._audit_read(asker)
        if query.correlation:
            return HistoryAnswer(entries=await audit.request_trail(
                self.nc, self.layout, query.correlation,
                lambda kind: PolicySight(self.policy, asker, kind, "get")))
        kind = _served_kind(query.kind)
        if not query.name:
            raise Refused(MALFORMED, "name: a history names one object")
        namespace = "" if is_cluster_scoped(kind) else query.namespace
        sight = PolicySight(self.policy, asker, kind, "get")
        _forbid(sight, namespace)
        return HistoryAnswer(entries=await audit.object_history(
            self.nc, self.layout, kind, namespace, query.name, sight=sight))

    async def _watch(self, asker: str, query: WatchQuery) -> WatchAnswer:
        """One page of changes from `since`; an empty page (and the same `next`) when none
        came within `WATCH_WAIT_SECONDS`, so a client polls again without missing any."""
        self._audit_read(asker)
        sight = PolicySight(self.policy, asker, _served_kind(query.kind), "watch")
        if query.namespace:
            _forbid(sight, query.namespace)
        match query.since:
            case None:
                first = await head(self.nc, self.layout) + 1
            case int(first) if first < 1:
                raise Refused(MALFORMED, f"since: must be a sequence from 1, not {first}")
            case int(first):
                pass
            case at:
                first = await start_sequence_at(self.nc, self.layout, at)
        try:
            await self._advanced_to(first, WATCH_WAIT_SECONDS)
        except TimeoutError:
            return WatchAnswer(next=first)
        changes, next_first = await audit.changes_from(self.nc, self.layout, query, first,
                                                       sight)
        return WatchAnswer(changes=changes, next=next_first)

    async def _console(self, asker: str, query: ConsoleQuery) -> ConsoleAnswer:
        if not query.namespace or not query.name:
            raise Refused(MALFORMED, "name: a console names one VMI and its namespace")
        try:
            return await console_page(self.nc, self.layout, self.state, self.policy,
                                      asker=asker, query=query)
        except ConsoleRefused as e:
            raise Refused(FORBIDDEN_REASON if e.forbidden else NO_CONSOLE, str(e)) from None

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
        server = (await http.serve(self.state, self, *listen, self.tokens,
                                   trust_proxy_headers=self.trust_proxy_headers)
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


def run(access: Access, layout: Layout, listen: tuple[str, int] | None = None, *,
        policy: Policy | None = None, tokens: StaticTokens | None = None,
        audit_limit: AuditLimit | None = None, trust_proxy_headers: bool = False) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.get_running_loop()
        report_loop_errors(running)
        for sig in (signal.SIGTERM, signal.SIGINT):
            running.add_signal_handler(sig, stop.set)
        nc = await connect_unless_stopped(access, f"{layout.prefix}-projections", stop)
        if nc is None:
            return
        log.info("read service started", nats_url=shown(access.url), prefix=layout.prefix,
                 authorization="policy" if policy is not None and policy.enforced else "open")
        try:
            service = ReadService(nc, layout, policy, tokens, audit_limit,
                                  trust_proxy_headers=trust_proxy_headers)
            await service.run(stop, listen)
        finally:
            await nc.close()

    tune_for_service()
    asyncio.run(main())
