"""Following the event log from asyncio: replay to the head with batched Direct Get, then
stay live on an ordered consumer. Every reader (read models, controllers, the dispatcher,
`watch`) folds the log through this one loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from events.codec import Event, decode
from events.datastore import TOPIC_HEADER
from events.directget import PAGE, direct_batch, first_since, last_on, sequence
from events.subjects import Layout

log = structlog.get_logger(__name__)

PROGRESS_EVERY_SECONDS = 2.0
STALL_CHECK_SECONDS = 3.0
"""How long a live follow waits in silence before it checks that it missed nothing."""

OnEvent = Callable[[int, Event], Awaitable[None]]
OnCaughtUp = Callable[[], Awaitable[None]]


def decode_msg(msg: Msg) -> Event:
    return decode((msg.headers or {})[TOPIC_HEADER], msg.data)


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
    stop: asyncio.Event | None = None,
) -> None:
    """Deliver every event from `start` on, in order, until `stop` is set."""
    subject = subject or layout.events_filter()
    stop = stop or asyncio.Event()
    target = await head(nc, layout, subject)
    position = start
    progress = _Progress(start, target)
    while position <= target and not stop.is_set():
        page = await direct_batch(nc, layout.events_stream, position, PAGE, subject)
        for msg in page:
            await on_event(sequence(msg), decode_msg(msg))
        if page:
            # A page may run past `target` (appended since `head`): go live after the last
            # event delivered, not after `target`, or those events come twice.
            position = sequence(page[-1]) + 1
        if len(page) < PAGE:
            break
        progress.report(position)
    progress.done()
    if on_caught_up is not None:
        await on_caught_up()
    await _follow_live(nc, layout, on_event, subject=subject, position=position, stop=stop)


async def _follow_live(nc: Client, layout: Layout, on_event: OnEvent, *, subject: str,
                       position: int, stop: asyncio.Event) -> None:
    """Stay live from `position` on an ordered consumer, watched: when nothing arrives for
    `STALL_CHECK_SECONDS` while the log holds events past `position`, the consumer is
    presumed lost (a reset nats-py could not finish, a connection dropped) and replaced
    from `position`. Anything already handed over is skipped, so a replacement, or
    nats-py's own reset, never delivers an event twice."""
    queue: asyncio.Queue[Msg] = asyncio.Queue()
    stopped = asyncio.ensure_future(stop.wait())
    got: asyncio.Future[Msg] | None = None
    sub = await _subscribe(nc, subject, position, queue)
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
                    if await _missed_some(nc, layout, subject, position):
                        log.warning("live follow stalled; resubscribing", position=position)
                        await sub.unsubscribe()
                        sub = await _subscribe(nc, subject, position, queue)
                    continue
                msg = got.result()
            seq = msg.metadata.sequence.stream
            if seq >= position:
                position = seq + 1
                await on_event(seq, decode_msg(msg))
    finally:
        # Neither waiter may outlive the follow (cancelled, stopped or failed).
        stopped.cancel()
        if got is not None:
            got.cancel()
        await sub.unsubscribe()


async def _missed_some(nc: Client, layout: Layout, subject: str, position: int) -> bool:
    """Whether the log holds an event at or past `position`; not knowing is not missing."""
    try:
        return await head(nc, layout, subject) >= position
    except (TimeoutError, NatsError) as e:
        log.warning("live follow could not read the log's head", error=str(e))
        return False


async def _subscribe(nc: Client, subject: str, position: int,
                     queue: asyncio.Queue[Msg]) -> JetStreamContext.PushSubscription:
    return await nc.jetstream().subscribe(
        subject, ordered_consumer=True, cb=queue.put,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                              opt_start_seq=position),
    )
