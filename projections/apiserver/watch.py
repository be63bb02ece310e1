"""Watches over the HTTP API, as kube-apiserver serves them (`?watch=true` or `?watch=1` on a
list path): a chunked `application/json` stream of `{"type": ..., "object": ...}` lines,
`ADDED`, `MODIFIED`, `DELETED` and `BOOKMARK`, each object as the asker's sight shows it.

resourceVersion is the event log's sequence, and the log keeps everything, so a watch
resumes from any resourceVersion ever issued: no compaction, no `410 Gone`. A watch folds
the log itself (`Watcher`): from the newest snapshot at or before where it starts
(`projections.snapshots`), the log's tail to there, then every event after it in order, each
compared with what the watch last sent of the objects it may change. So every change is
sent, none twice, and each event's object is the object as it stood after that event
(`metadata.resourceVersion` that event's sequence).

- `resourceVersion` absent or `0`: kube's "Get State and Start at Most Recent": an `ADDED`
  for every object now, then the changes; `resourceVersion=N`: every change after N (a
  resourceVersion the log has not reached: the changes after it, once it has).
- `sendInitialEvents=true` (watch-list): the `ADDED` events of the state now (at least
  `resourceVersion`), then, with `allowWatchBookmarks=true`, a `BOOKMARK` annotated
  `k8s.io/initial-events-end: "true"`; `allowWatchBookmarks=true`: a `BOOKMARK` with the
  resourceVersion read so far every `BOOKMARK_SECONDS`.
- `fieldSelector` `metadata.name` and `metadata.namespace` (what `kubectl get -w NAME`
  sends); any other field, and any `labelSelector`, is 400.
- `timeoutSeconds`: the stream ends then (default `DEFAULT_TIMEOUT_SECONDS`).
- `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` (`kubectl get -w`): each object
  as a one-row `Table`, the column definitions in the first event only, as kube-apiserver
  sends them (kubectl prints later rows under the first event's columns).

A VirtualMachine or VirtualMachineInstance is changed by its own events and those of the
object of the same name (a VM's status is its VMI's); every other kind is rendered whole
after each event and compared (the nodes' usage, a replica set's counts). A namespace the
asker may not watch is 403; a watch of every namespace shows what the asker may watch, as a
list shows what it may list.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from aiohttp import web
from nats.aio.client import Client
from nats.errors import Error as NatsError

from events.api.kinds import Kind
from events.authorization.policy import Request
from events.jetstream.directget import PAGE, direct_batch, read_all, sequence
from events.language.codec import Event
from events.language.query import Query
from events.language.subjects import Layout, aggregate_id, split_aggregate_id
from projections.apiserver import tables
from projections.bulk import uncollected
from projections.cluster import ClusterState
from projections.follower import read_event
from projections.rendering import render, render_view
from projections.snapshots import Snapshots, restore

BOOKMARK_SECONDS: Final = 10.0
"""How often a watch that asked for bookmarks gets one (kube-apiserver: about a minute)."""
DEFAULT_TIMEOUT_SECONDS: Final = 1800
"""A watch's length when `timeoutSeconds` names none (kube-apiserver's `--min-request-timeout`)."""
WAKE_SECONDS: Final = 1.0
"""The longest an idle watch waits before it looks whether its client has gone."""
INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"
OWN_OBJECT_KINDS: Final = frozenset({"VirtualMachine", "VirtualMachineInstance"})
TABLE_TYPE: Final = "application/json;as=Table;v=v1;g=meta.k8s.io"
Key = tuple[str, str]


class Sight(Protocol):
    """What one asker may watch of one kind (`projections.service.PolicySight`)."""

    def may_read(self, namespace: str) -> bool: ...

    def show(self, item: dict[str, Any]) -> dict[str, Any] | None: ...

    def request(self, namespace: str) -> Request: ...


class Source(Protocol):
    """What a watch reads: the log, and the read model's progress through it."""

    nc: Client
    layout: Layout

    async def folded_past(self, sequence: int, timeout: float) -> int:
        """The read model's last sequence once it is past `sequence`, or after `timeout`."""

    def sight(self, asker: str, kind: str, verb: str) -> Sight: ...


def wanted(params: Mapping[str, str]) -> bool:
    """Whether a list request asks a watch."""
    return params.get("watch", "").lower() in ("true", "1")


@dataclass(frozen=True)
class Asked:
    """A watch's parameters."""

    namespace: str
    name: str
    since: int | None
    """The resourceVersion it resumes after; None: the state now first."""
    initial: bool
    bookmarks: bool
    timeout: float
    table: bool
    include_object: str


def asked(query: Query, params: Mapping[str, str], accept: str) -> Asked:
    """The watch `params` ask on the list `query` names; ValueError naming a parameter that
    is not one this server serves."""
    namespace, name = query.namespace, ""
    for term in filter(None, params.get("fieldSelector", "").split(",")):
        field, op, value = term.replace("==", "=").partition("=")
        if not op or field.endswith("!") or field not in ("metadata.name", "metadata.namespace"):
            raise ValueError(f"fieldSelector: field label not supported: {term[:64]}")
        if field == "metadata.name":
            name = value
        elif namespace and value != namespace:
            raise ValueError("fieldSelector: metadata.namespace is not the path's namespace")
        else:
            namespace = value
    if params.get("labelSelector", ""):
        raise ValueError("labelSelector: not served on a watch yet")
    version = params.get("resourceVersion", "")
    if version and not version.isdigit():
        raise ValueError(f"resourceVersion: not a resourceVersion, {version[:40]!r}")
    timeout = params.get("timeoutSeconds", "")
    if timeout and not timeout.isdigit():
        raise ValueError(f"timeoutSeconds: must be an integer, not {timeout[:40]!r}")
    since = int(version) if version and int(version) else None
    initial = params.get("sendInitialEvents", "") == "true" or (
        since is None and params.get("sendInitialEvents", "") != "false")
    return Asked(namespace=namespace, name=name, since=since, initial=initial,
                 bookmarks=params.get("allowWatchBookmarks", "") == "true",
                 timeout=float(int(timeout or 0) or DEFAULT_TIMEOUT_SECONDS),
                 table=tables.wants_table(accept),
                 include_object=params.get("includeObject", ""))


class Watcher:
    """One watch's own fold of the log, and what it last sent of each object."""

    def __init__(self, source: Source, kind: Kind, asked: Asked, sight: Sight) -> None:
        self.source, self.kind, self.asked, self.sight = source, kind, asked, sight
        self.state = ClusterState()
        self.last: dict[Key, dict[str, Any]] = {}
        self.position = 1
        """The next sequence to read."""
        self.first = 1
        """The first sequence whose changes are sent (those before it are folded only)."""

    @property
    def resource_version(self) -> int:
        """Where the watch stands: every change up to it has been sent."""
        return max(self.first, self.position) - 1

    async def prime(self, stop: int) -> list[dict[str, Any]]:
        """Fold the log to `stop` (as far as it goes), and the objects then, as shown."""
        nc, layout = self.source.nc, self.source.layout
        start = await restore(Snapshots(nc, layout), self.state, at_most=stop, announce=False)
        self.position = start
        with uncollected():
            for msg in await read_all(nc, layout.events_stream, layout.events_filter(),
                                      start=start, stop=stop):
                self._fold(msg)
        self.first = stop + 1
        self.last = {_key(o): o for o in self._objects()}
        return list(self.last.values())

    async def step(self) -> tuple[list[dict[str, Any]], bool]:
        """The watch events of the next page of the log, and whether the log has more."""
        layout = self.source.layout
        page = await direct_batch(self.source.nc, layout.events_stream, self.position, PAGE,
                                  layout.events_filter())
        out: list[dict[str, Any]] = []
        for msg in page:
            event = self._fold(msg)
            if event is None:
                continue
            for kind, obj in self._changes(event):
                if sequence(msg) >= self.first:
                    out.append(_event(kind, _at(obj, sequence(msg))))
        return out, len(page) == PAGE

    def _fold(self, msg: Any) -> Event | None:
        self.position = max(self.position, sequence(msg) + 1)
        event = read_event(msg, on_skip=self.state.skip)
        if event is None or self.state.apply(event, sequence(msg)) is None:
            return None
        return event

    def _changes(self, event: Event) -> list[tuple[str, dict[str, Any]]]:
        """What the event changed of what the watch shows, `last` brought up to date."""
        if self.kind.kind in OWN_OBJECT_KINDS:
            _, namespace, name = split_aggregate_id(event.originator_id)
            one = self._one(namespace, name)
            now = {} if one is None else {(namespace, name): one}
            keys = [(namespace, name)]
        else:
            now = {_key(o): o for o in self._objects()}
            keys = list(dict.fromkeys([*self.last, *now]))
        out: list[tuple[str, dict[str, Any]]] = []
        for key in keys:
            before, after = self.last.get(key), now.get(key)
            if after is None and before is not None:
                out.append(("DELETED", before))
                del self.last[key]
            elif after is not None and after != before:
                out.append(("ADDED" if before is None else "MODIFIED", after))
                self.last[key] = after
        return out

    def _one(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The watched kind's object of that namespace and name, as shown, if watched."""
        if self.asked.namespace not in ("", namespace) or self.asked.name not in ("", name):
            return None
        view = self.state.views.get(aggregate_id(self.kind.token, namespace, name))
        rendered = None if view is None else render_view(self.state, view)
        return None if rendered is None else self.sight.show(rendered)

    def _objects(self) -> list[dict[str, Any]]:
        query = Query(kind=self.kind.kind, namespace=self.asked.namespace, name=self.asked.name)
        with uncollected():
            rendered = render(self.state, query)
        return [shown for item in rendered if (shown := self.sight.show(item)) is not None]


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata", {})
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _at(obj: dict[str, Any], at: int) -> dict[str, Any]:
    """`obj` as it stood at sequence `at`: its resourceVersion that one."""
    return {**obj, "metadata": {**obj.get("metadata", {}), "resourceVersion": str(at)}}


def _event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def bookmark(kind: Kind, at: int, initial_end: bool = False) -> dict[str, Any]:
    """A `BOOKMARK`: an object of the kind with only its resourceVersion (and, at the end of
    a watch-list's initial events, kube's annotation saying so)."""
    meta: dict[str, Any] = {"resourceVersion": str(at), "creationTimestamp": None}
    if initial_end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    api_version = f"{kind.group}/{kind.versions[0]}" if kind.group else kind.versions[0]
    return _event("BOOKMARK", {"kind": kind.kind, "apiVersion": api_version, "metadata": meta})


class Stream:
    """A watch's response: each event a JSON line (a `Table` where one was asked)."""

    def __init__(self, response: web.StreamResponse, kind: Kind, asked: Asked) -> None:
        self.response, self.kind, self.asked = response, kind, asked
        self.headers_sent = False

    async def send(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        await self.response.write(b"".join(
            json.dumps(self._shaped(e)).encode() + b"\n" for e in events))

    def _shaped(self, event: dict[str, Any]) -> dict[str, Any]:
        if not self.asked.table:
            return event
        obj = event["object"]
        if event["type"] == "BOOKMARK":
            shaped = {"kind": "Table", "apiVersion": tables.TABLE_VERSION,
                      "metadata": obj["metadata"], "columnDefinitions": None, "rows": []}
        else:
            shaped = tables.table(self.kind, obj, self.asked.include_object)
            if self.headers_sent:
                shaped["columnDefinitions"] = None
            self.headers_sent = True
        return {"type": event["type"], "object": shaped}


def _gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def serve(request: web.Request, source: Source, live: ClusterState, *, kind: Kind,
                query: Query, asker: str) -> web.StreamResponse | tuple[int, str]:
    """Stream the watch `request` asks; (code, message) where it is refused before it starts
    (400 for a parameter, 403 for a namespace the asker may not watch)."""
    try:
        watch = asked(query, request.query, request.headers.get("Accept", ""))
    except ValueError as e:
        return 400, str(e)
    sight = source.sight(asker, kind.kind, "watch")
    scope = "" if not kind.namespaced else watch.namespace
    if (scope or not kind.namespaced) and not sight.may_read(scope):
        return 403, f"forbidden: User {asker!r} {sight.request(scope)}"
    response = web.StreamResponse(headers={
        "Content-Type": TABLE_TYPE if watch.table else "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    stream = Stream(response, kind, watch)
    try:
        await asyncio.wait_for(_run(request, source, live, stream, sight), watch.timeout)
    except (TimeoutError, ConnectionResetError):
        pass
    except (NatsError, RuntimeError) as e:  # the log could not be read: the stream ends
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
                  "reason": "InternalError", "message": f"{type(e).__name__}: {e}"}
        await response.write(json.dumps(_event("ERROR", status)).encode() + b"\n")
    return response


async def _run(request: web.Request, source: Source, live: ClusterState, stream: Stream,
               sight: Sight) -> None:
    """The initial events (where asked), then every change as the log grows, bookmarks
    between them where asked, until the client goes (or the caller's timeout)."""
    watch, kind = stream.asked, stream.kind
    watcher = Watcher(source, kind, watch, sight)
    now = live.last_sequence
    current = await watcher.prime(max(now, watch.since or 0) if watch.initial
                                  else watch.since or now)
    if watch.initial:
        await stream.send([_event("ADDED", obj) for obj in current])
        if watch.bookmarks and request.query.get("sendInitialEvents") == "true":
            await stream.send([bookmark(kind, watcher.resource_version, initial_end=True)])
    loop = asyncio.get_running_loop()
    next_bookmark = loop.time() + BOOKMARK_SECONDS
    while not _gone(request):
        events, more = await watcher.step()
        await stream.send(events)
        if watch.bookmarks and loop.time() >= next_bookmark:
            await stream.send([bookmark(kind, watcher.resource_version)])
            next_bookmark = loop.time() + BOOKMARK_SECONDS
        if not more:
            await source.folded_past(watcher.position - 1, WAKE_SECONDS)
