"""Following the event log from asyncio: replay to the head with batched Direct Get, then
stay live on an ordered consumer. Every reader (read models, controllers, the dispatcher,
`watch`) folds the log through this one loop."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Collection
from datetime import datetime
from typing import Final

import structlog
from eventsourcing.persistence import MapperDeserialisationError
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from events.jetstream.datastore import TOPIC_HEADER
from events.jetstream.directget import PAGE, direct_batch, first_since, last_on, sequence
from events.jetstream.transient import describe, is_transient, retry_until_stopped
from events.language.codec import Event, decode, event_class, split_topic
from events.language.messages import COMMAND_KIND, Outcome, recorded_outcome
from events.language.subjects import Layout
from events.runtime.aio import delivered_sequence, pause_unless_stopped

log = structlog.get_logger(__name__)

PROGRESS_EVERY_SECONDS = 2.0
STALL_CHECK_SECONDS = 3.0
"""How long a live follow waits in silence before it checks that it missed nothing."""

OnEvent = Callable[[int, Event], Awaitable[None]]
OnCaughtUp = Callable[[], Awaitable[None]]
OnSkip = Callable[[int, str], Awaitable[None]]
"""Told the sequence and the reason (one of `SKIP_REASONS`) of each message skipped."""

NO_TOPIC: Final = "no_topic"
"""No `Vb-Topic` header: not an event (a stray publish, a reply that landed on the subject)."""
BAD_TOPIC: Final = "bad_topic"
"""A `Vb-Topic` that is not `<TypeName>.v<schema>`."""
UNKNOWN_TYPE: Final = "unknown_type"
"""A type name this version does not know (written by a newer version, or by no version)."""
FUTURE_SCHEMA: Final = "future_schema"
"""A schema version newer than the type's class here: no upcaster can read it."""
UNDECODABLE: Final = "undecodable"
"""A known type and schema whose body does not decode (or does not upcast)."""
MISPLACED: Final = "misplaced"
"""An event stored on another object's subject than its own: a copy, as a Direct Get answer
aimed at an event subject puts one there; folded, it would change the wrong object."""
NOT_A_MARKER: Final = "not_a_marker"
"""An event on a command's marker subject (`ev.command._.<id>`) that is not that command's
outcome marker: folded, it could pass for the command's outcome, or hide it."""
SKIP_REASONS: Final = (NO_TOPIC, BAD_TOPIC, UNKNOWN_TYPE, FUTURE_SCHEMA, UNDECODABLE,
                       MISPLACED, NOT_A_MARKER)


def read_event(msg: Msg, seq: int | None = None,
               on_skip: Callable[[int, str], object] | None = None) -> Event | None:
    """The event in `msg`, or None for a message this version cannot decode (see
    `SKIP_REASONS`): that one is logged (one warning line with its sequence, subject, topic
    and reason) and reported to `on_skip(sequence, reason)`, which counts it
    (`ClusterState.skip`). Every reader of the log decodes through this (`follow` too), so no
    message in it can stop one. `seq` is the message's stream sequence where the caller
    knows it better than a Direct Get reply's header (a live consumer's metadata)."""
    if seq is None:
        seq = sequence(msg) if msg.headers and "Nats-Sequence" in msg.headers else 0
    got = _read(msg, seq)
    if isinstance(got, str):
        if on_skip is not None:
            on_skip(seq, got)
        return None
    return got


def first_outcome(stored: list[Msg]) -> tuple[Outcome, int] | None:
    """A command's first outcome and its marker's sequence, from what its marker subject
    holds: the first well-formed marker of that command, past any stray stored there."""
    for msg in stored:
        event = read_event(msg)
        outcome = recorded_outcome(event, sequence(msg)) if event is not None else None
        if outcome is not None:
            return outcome, sequence(msg)
    return None


def _read(msg: Msg, seq: int) -> Event | str:
    """The event, or the reason it is skipped (logged here, once)."""
    headers = msg.headers or {}
    subject = headers.get("Nats-Subject", msg.subject)  # a Direct Get's reply names it
    topic = headers.get(TOPIC_HEADER)
    if topic is None:
        reason, detail = NO_TOPIC, f"no {TOPIC_HEADER} header ({len(msg.data)} bytes)"
    else:
        reason, detail = _unreadable(topic)
        if not reason:
            try:
                event = decode(topic, msg.data)
            except Exception as e:  # whatever the bytes or an upcaster raise: not fatal
                reason, detail = UNDECODABLE, f"{type(e).__name__}: {e}"
            else:
                if subject.split(".", 2)[1:] != ["ev", event.originator_id]:
                    reason, detail = MISPLACED, f"an event of {event.originator_id}"
                elif event.originator_id.startswith(f"{COMMAND_KIND}.") \
                        and recorded_outcome(event, seq) is None:
                    reason, detail = NOT_A_MARKER, f"a {type(event).__name__}"
                else:
                    return event
    log.warning("skipped an event this version cannot read",
                sequence=seq, subject=subject, topic=topic, reason=reason, detail=detail)
    return reason


@functools.lru_cache(maxsize=1024)
def _unreadable(topic: str) -> tuple[str, str]:
    """Why a message with this topic cannot be decoded here, before its body is tried, or
    ('', '') if it may be (`decode` itself would read a future schema as the current one).
    A verdict per topic, of which a log holds few, so a replay pays for it once each."""
    try:
        name, schema = split_topic(topic)
    except ValueError:
        return BAD_TOPIC, f"not <TypeName>.v<schema>: {topic!r}"
    try:
        cls = event_class(name)
    except MapperDeserialisationError as e:
        return UNKNOWN_TYPE, str(e)
    if schema > cls.SCHEMA:
        return FUTURE_SCHEMA, f"schema {schema}, this version reads up to {cls.SCHEMA}"
    return "", ""


async def head(nc: Client, layout: Layout, subject: str | None = None) -> int:
    """The sequence of the newest event (0 for an empty log)."""
    msg = await last_on(nc, layout.events_stream, subject or layout.events_filter())
    return 0 if msg is None else sequence(msg)


async def start_sequence_at(nc: Client, layout: Layout, at: datetime) -> int:
    """The first sequence stored at or after `at` (for `--since TIME`)."""
    first = await first_since(nc, layout.events_stream, layout.events_filter(), at)
    return sequence(first) if first is not None else await head(nc, layout) + 1


class _Progress:
    """Logs a long replay's progress every few seconds, and its rate at the end."""

    def __init__(self, start: int, target: int) -> None:
        self.start, self.target = start, target
        self.began = self.last = time.monotonic()

    def report(self, position: int) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_SECONDS:
            self.last = now
            done = position - self.start
            log.info("replaying", position=position, target=self.target,
                     percent=round(100 * done / max(self.target - self.start + 1, 1), 1))

    def done(self) -> None:
        seconds = time.monotonic() - self.began
        count = max(self.target - self.start + 1, 0)
        if count:
            log.info("replayed", events=count, seconds=round(seconds, 3),
                     per_s=round(count / seconds) if seconds else None)


async def follow(
    nc: Client,
    layout: Layout,
    on_event: OnEvent,
    *,
    start: int = 1,
    subject: str | None = None,
    on_caught_up: OnCaughtUp | None = None,
    on_skip: OnSkip | None = None,
    stop: asyncio.Event | None = None,
    poll_seconds: float | None = None,
    live_kinds: Collection[str] = (),
) -> None:
    """Deliver every event from `start` on, in order, until `stop` is set. A message this
    version cannot decode is skipped (logged, and told to `on_skip`), never delivered, and
    the follow goes on past it. A read NATS cannot answer now (a server of the cluster
    lost, a leader being elected) is tried again from where it was, one log line per
    attempt, until it is answered or `stop` is set.

    Live, it reads from an ordered consumer; given `poll_seconds`, by Direct Get pages that
    often instead: a person may create no consumer (`events.authorization.accounts.person`). Given
    `live_kinds`, the live follow asks the server for those kinds' events only
    (`ev.<kind>.>`; the replay up to the head still reads everything): the server then
    sends nothing the reader would drop (the control plane, commands' markers, half of
    the log under client load)."""
    subject = subject or layout.events_filter()
    stop = stop or asyncio.Event()
    target = await retry_until_stopped(lambda: head(nc, layout, subject),
                                       "reading the log's head", stop)
    if target is None:  # stopped first
        return
    progress = _Progress(start, target)
    position = await _read_pages(nc, layout, on_event, on_skip, subject=subject,
                                 position=start, stop=stop, progress=progress)
    if position is None:  # stopped first
        return
    progress.done()
    if on_caught_up is not None:
        await on_caught_up()
    if poll_seconds is None:
        live = tuple(layout.events_filter(kind) for kind in live_kinds) or (subject,)
        await _follow_live(nc, layout, on_event, on_skip, subjects=live, position=position,
                           stop=stop)
        return
    while position is not None and not stop.is_set():
        await pause_unless_stopped(stop, poll_seconds)
        position = await _read_pages(nc, layout, on_event, on_skip, subject=subject,
                                     position=position, stop=stop)


async def _read_pages(nc: Client, layout: Layout, on_event: OnEvent, on_skip: OnSkip | None,
                      *, subject: str, position: int, stop: asyncio.Event,
                      progress: _Progress | None = None) -> int | None:
    """Hand over every event from `position` to the log's end, a Direct Get page at a time;
    where the next read starts (None if stopped first)."""
    while not stop.is_set():
        page = await retry_until_stopped(
            functools.partial(direct_batch, nc, layout.events_stream, position, PAGE, subject),
            "replaying the log", stop, position=position)
        if page is None:  # stopped first
            return None
        for msg in page:
            await _hand_over(msg, sequence(msg), on_event, on_skip)
        if page:
            # A page may run past the head read before (appended since): go on after the
            # last event delivered, or those events come twice.
            position = sequence(page[-1]) + 1
        if len(page) < PAGE:
            break
        if progress is not None:
            progress.report(position)
    return position


async def _hand_over(msg: Msg, seq: int, on_event: OnEvent, on_skip: OnSkip | None) -> None:
    got = _read(msg, seq)
    if not isinstance(got, str):
        await on_event(seq, got)
    elif on_skip is not None:
        await on_skip(seq, got)


async def _follow_live(nc: Client, layout: Layout, on_event: OnEvent, on_skip: OnSkip | None,
                       *, subjects: tuple[str, ...], position: int,
                       stop: asyncio.Event) -> None:
    """Stay live from `position` on an ordered consumer of `subjects`, watched: when nothing
    arrives for `STALL_CHECK_SECONDS` while the log holds events of `subjects` past
    `position`, the consumer is presumed lost (a reset nats-py could not finish, a
    connection dropped) and replaced from `position`. Anything already handed over is
    skipped, so a replacement, or nats-py's own reset, never delivers an event twice."""
    queue: asyncio.Queue[Msg] = asyncio.Queue()
    stopped = asyncio.ensure_future(stop.wait())
    got: asyncio.Future[Msg] | None = None
    sub = await retry_until_stopped(lambda: _subscribe(nc, layout, subjects, position, queue),
                                    "following the log live", stop, position=position)
    if sub is None:  # stopped first
        stopped.cancel()
        return
    try:
        while not stop.is_set():
            if not queue.empty():
                msg = queue.get_nowait()  # a burst already delivered needs no waiter
            else:
                got = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({got, stopped}, timeout=STALL_CHECK_SECONDS,
                                             return_when=asyncio.FIRST_COMPLETED)
                if stopped in done:
                    break
                if got not in done:
                    got.cancel()
                    if await _missed_some(nc, layout, subjects, position):
                        log.warning("live follow stalled; resubscribing", position=position)
                        await _unsubscribe(sub)
                        try:
                            sub = await _subscribe(nc, layout, subjects, position, queue)
                        except Exception as e:  # NATS failing over: at the next check again
                            if not is_transient(e):
                                raise
                            log.warning("live follow could not resubscribe; retrying",
                                        position=position, error=describe(e))
                    continue
                msg = got.result()
            seq = delivered_sequence(msg)
            if seq >= position:
                position = seq + 1
                await _hand_over(msg, seq, on_event, on_skip)
    finally:
        # Neither waiter may outlive the follow (cancelled, stopped or failed).
        stopped.cancel()
        if got is not None:
            got.cancel()
        await _unsubscribe(sub)


async def _unsubscribe(sub: JetStreamContext.PushSubscription) -> None:
    """Drop a live follow's consumer; one already dropped, or a connection being
    re-established, is not an error here (a consumer left behind expires on the server)."""
    try:
        await sub.unsubscribe()
    except (TimeoutError, NatsError) as e:
        log.debug("live follow's old consumer not unsubscribed", error=describe(e))


async def _missed_some(nc: Client, layout: Layout, subjects: tuple[str, ...],
                       position: int) -> bool:
    """Whether the log holds an event of `subjects` at or past `position` (what lies past it
    on other subjects was never asked for); not knowing is not missing."""
    try:
        heads = await asyncio.gather(*[head(nc, layout, s) for s in subjects])
        return max(heads) >= position
    except (TimeoutError, NatsError) as e:
        log.warning("live follow could not read the log's head", error=str(e))
        return False


async def _subscribe(nc: Client, layout: Layout, subjects: tuple[str, ...], position: int,
                     queue: asyncio.Queue[Msg]) -> JetStreamContext.PushSubscription:
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                            opt_start_seq=position)
    if len(subjects) == 1:
        return await nc.jetstream().subscribe(subjects[0], ordered_consumer=True,
                                              cb=queue.put, config=config)
    config.filter_subjects = list(subjects)
    return await nc.jetstream().subscribe("", stream=layout.events_stream,
                                          ordered_consumer=True, cb=queue.put, config=config)
