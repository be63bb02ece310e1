"""The past, read from the log itself: the cluster at a point, one object's history, one
request's trail across objects, and the changes from a point on. The read service runs these
for whoever asks and shows each answer through the asker's `Sight`, so a person who may not
read the log (every namespace, cloud-init secrets in clear) audits what it may read. The
cluster at a point and the changes from a point start from the newest snapshot before that
point (`projections.snapshots`) and fold the log's tail from there, so they cost what lies
between, not the whole history; a history reads its object's own subject.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from datetime import datetime
from typing import Any, Final, Protocol

import jsonpatch
from nats.aio.client import Client
from nats.aio.msg import Msg

from events.api.kinds import is_cluster_scoped, name_of_token, token_of
from events.jetstream.directget import pages, read_all, sequence
from events.language.codec import Event
from events.language.kinds.nodes import NODE_KIND
from events.language.kinds.vm import VM_KIND, VMI_KIND
from events.language.query import WATCH_PAGE, Change, HistoryEntry, Query, WatchQuery
from events.language.subjects import Layout, aggregate_id, split_aggregate_id
from projections.bulk import uncollected
from projections.cluster import ClusterState
from projections.follower import head, read_event, start_sequence_at
from projections.rendering import render_view
from projections.snapshots import Snapshots, restore
from projections.views import View


class Sight(Protocol):
    """What one asker may see of one kind (`projections.service.PolicySight`)."""

    def may_read(self, namespace: str) -> bool: ...

    def show(self, item: dict[str, Any]) -> dict[str, Any] | None:
        """`item` as the asker may see it (secrets redacted), or None if it may not."""


SightOf = Callable[[str], Sight]
"""The asker's sight of a kind."""


async def state_at(nc: Client, layout: Layout, at: int | datetime,
                   query: Query | None = None) -> ClusterState:
    """The cluster as it stood at a sequence or an instant, as far as `query` reads it: one
    object by name (`object_at`) from its own subjects, anything else from the newest
    snapshot no later than that and the log's tail after it."""
    stop = at if isinstance(at, int) else await start_sequence_at(nc, layout, at) - 1
    if query is not None and query.name and query.namespace and query.kind in _READS:
        return await object_at(nc, layout, query, stop)
    state = ClusterState()
    start = await restore(Snapshots(nc, layout), state, at_most=stop, announce=False,
                          kinds=_VIEWS_READ.get(query.kind) if query is not None else None)
    tail = await read_all(nc, layout.events_stream, layout.events_filter(), start=start,
                          stop=stop)
    with uncollected():
        for msg in tail:
            _fold(state, msg)  # what it changed is not needed here
    return state


_VIEWS_READ: Final[dict[str, frozenset[str]]] = {
    "VirtualMachine": frozenset({VM_KIND, VMI_KIND}),
    "VirtualMachineInstance": frozenset({VMI_KIND, NODE_KIND}),
}
"""The kinds of views rendering objects of a kind reads (`render`, `render_view`): a VM
its VMI, a VMI its node (whether its launcher is outdated). A read of any other kind
restores every view."""
_READS: Final[dict[str, tuple[str, ...]]] = {
    "VirtualMachine": (VM_KIND, VMI_KIND),
    "VirtualMachineInstance": (VMI_KIND,),
}
"""What rendering one object of a kind reads besides its own view (`render`): a VM its VMI
of the same name; a VMI its node (whether its launcher is outdated), found on the VMI."""


async def object_at(nc: Client, layout: Layout, query: Query, stop: int) -> ClusterState:
    """The views rendering the one object `query` names reads, as they stood at sequence
    `stop`: each folded from its own subject's events up to `stop` (an object's view is the
    fold of its own events, `ClusterState.apply`), so its cost is that object's history,
    not the cluster's. The answer's sequence is `stop` (the log's head if sooner)."""
    state = ClusterState()
    ids = [aggregate_id(token, query.namespace, query.name) for token in _READS[query.kind]]
    for agg in ids:
        await _fold_subject(nc, layout, state, agg, stop)
    vmi = state.vmi(query.namespace, query.name)
    if vmi is not None and vmi.node:
        await _fold_subject(nc, layout, state, aggregate_id(NODE_KIND, "", vmi.node), stop)
    state.last_sequence = min(stop, await head(nc, layout))
    return state


async def _fold_subject(nc: Client, layout: Layout, state: ClusterState, agg: str,
                        stop: int) -> None:
    for msg in await read_all(nc, layout.events_stream, layout.aggregate_subject(agg),
                              stop=stop):
        _fold(state, msg)


def _fold(state: ClusterState, msg: Msg) -> tuple[Event, View] | None:
    """Apply one stored message: the event and the view it changed, or None for a message
    this version cannot read (counted, skipped) or an event of no view (a command's marker)."""
    event = read_event(msg, on_skip=state.skip)
    view = None if event is None else state.apply(event, sequence(msg))
    return None if event is None or view is None else (event, view)


def _entry(msg: Msg, event: Event, changes: list[dict[str, Any]],
           obj: str = "") -> HistoryEntry:
    return HistoryEntry(sequence=sequence(msg), time=event.timestamp.isoformat(),
                        actor=event.actor, type=event.TYPE, command_id=event.causation_id,
                        correlation_id=event.correlation_id, changes=changes, object=obj)


async def object_history(nc: Client, layout: Layout, kind: str, namespace: str, name: str,
                         *, sight: Sight) -> list[HistoryEntry]:
    """Every event of one object, with who caused it and what changed: a JSON Patch between
    the object before and after, each as `sight` shows it (so a viewer's patches carry
    `<redacted>`, never a secret). The caller has checked that the asker may read it."""
    agg = aggregate_id(token_of(kind), "" if is_cluster_scoped(kind) else namespace, name)
    state = ClusterState()
    before: dict[str, Any] = {}
    out: list[HistoryEntry] = []
    for msg in await read_all(nc, layout.events_stream, layout.aggregate_subject(agg)):
        folded = _fold(state, msg)
        if folded is None:
            continue
        event, view = folded
        rendered = render_view(state, view)
        after = (sight.show(rendered) or {}) if rendered else {}
        after.get("metadata", {}).pop("resourceVersion", None)
        out.append(_entry(msg, event, jsonpatch.make_patch(before, after).patch))
        before = after
    return out


async def request_trail(nc: Client, layout: Layout, correlation_id: str,
                        sight_of: SightOf) -> list[HistoryEntry]:
    """Every event one request caused, across objects, in log order, of the objects the
    asker may read (a drain's cordon, its migrations and evictions, their VMIs' moves)."""
    out: list[HistoryEntry] = []
    for msg in await read_all(nc, layout.events_stream, layout.events_filter()):
        event = read_event(msg)
        if event is None or event.correlation_id != correlation_id:
            continue
        token, namespace, _ = split_aggregate_id(event.originator_id)
        # A token of no served kind (a command's marker) is a resource only `*` grants.
        if sight_of(name_of_token(token)).may_read(namespace):
            out.append(_entry(msg, event, [], str(event.originator_id)))
    return out


async def changes_from(nc: Client, layout: Layout, query: WatchQuery, first: int,
                       sight: Sight) -> tuple[list[Change], int]:
    """Up to `WATCH_PAGE` changes to the objects `query` names from sequence `first` on, as
    `sight` shows them (an object it may not read: no change at all), and the sequence the
    next page starts at: past every message read, so none is shown twice or skipped."""
    state = ClusterState()
    start = await restore(Snapshots(nc, layout), state, at_most=first - 1, announce=False,
                          kinds=_VIEWS_READ.get(query.kind))
    out: list[Change] = []
    position = first
    async with aclosing(pages(nc, layout.events_stream, layout.events_filter(),
                              start)) as paged:
        async for page in paged:
            for msg in page:
                if len(out) == WATCH_PAGE:
                    return out, position
                folded = _fold(state, msg)
                position = max(position, sequence(msg) + 1)
                if folded is None or sequence(msg) < first:
                    continue
                change = _change(state, msg, folded, query, sight)
                if change is not None:
                    out.append(change)
    return out, position


def _change(state: ClusterState, msg: Msg, folded: tuple[Event, View], query: WatchQuery,
            sight: Sight) -> Change | None:
    """The change the event in `msg` made to its view, if `query` names the object and
    `sight` may see it."""
    event, view = folded
    view_token, id_namespace, id_name = split_aggregate_id(event.originator_id)
    meta = getattr(view, "metadata", None)
    name = meta.name if meta is not None else id_name
    namespace = meta.namespace if meta is not None else id_namespace
    if view_token != token_of(query.kind) or (query.name and name != query.name) or (
            query.namespace and namespace != query.namespace):
        return None
    if not sight.may_read(namespace):
        return None
    rendered = render_view(state, view)
    return Change(sequence(msg), event.TYPE, event.timestamp, event.actor, namespace, name,
                  sight.show(rendered) if rendered else None)
