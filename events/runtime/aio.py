"""Small asyncio helpers every long-running loop uses."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import weakref
from collections.abc import Awaitable

import structlog
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

log = structlog.get_logger(__name__)

_V1_ACK_TOKENS = 9
"""`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`;
the longer form adds a domain and an account hash (`Msg.Ack`'s indexes)."""


def delivered_sequence(msg: Msg) -> int:
    """The stream sequence of a consumer's delivery, from its reply subject as nats-py reads
    it, without the `Metadata` it builds (a dataclass and a datetime per message: 3 % of the
    control plane's time, all in its follow of the log)."""
    tokens = Msg.Metadata._get_metadata_fields(msg.reply)
    return int(tokens[5] if len(tokens) == _V1_ACK_TOKENS else tokens[Msg.Ack.StreamSeq])


async def pause_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    """Wait `seconds` between rounds of a periodic loop, returning at once on `stop`."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def unless_stopped(work: Awaitable[object], stop: asyncio.Event) -> bool:
    """Run `work` to its end, unless `stop` is set first: then `work` is cancelled, so a
    start-up waiting on something absent never holds up a shutdown. Whether it ended."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        ended = task.done()
        if not ended:
            task.cancel()
            # What it meets on its way out (a request that fails as it is cancelled, which
            # `events.jetstream.transient` does not retry then) is no failure of work stopped
            # anyway.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if ended:
        task.result()  # its own error, if it failed
    return ended


async def together(*parts: Awaitable[object]) -> None:
    """Run `parts` until all have ended. The first to fail cancels the others, which are
    awaited before its error is raised: none outlives the caller, to fail later on the
    connection the caller closes and be reported, with a traceback, at the loop's close
    (`asyncio.gather` leaves them running)."""
    tasks = [asyncio.ensure_future(part) for part in parts]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        # What they meet on their way out is no failure of work stopped anyway.
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if task in done and not task.cancelled() and task.exception() is not None:
            task.result()  # the first failure's own error


def report_loop_errors(loop: asyncio.AbstractEventLoop) -> None:
    """What asyncio reports itself (an exception no task retrieved, a callback that
    failed) as one log line, not the traceback its default handler prints."""

    def report(_loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        error = context.get("exception")
        task = context.get("task") or context.get("future")
        coro = task.get_coro() if isinstance(task, asyncio.Task) else None
        log.error(str(context.get("message", "asyncio error")),
                  error=repr(error) if error is not None else None,
                  coroutine=getattr(coro, "__qualname__", None))

    loop.set_exception_handler(report)


ACK_WAIT_SECONDS = 6.0
"""How long JetStream waits for an ack before redelivering: short, so work held by a process
that died is taken up again soon after it restarts. Live work keeps its claim with
`in_progress` (see `claimed`)."""


def claimed(msg: Msg) -> _Claim:
    """`async with claimed(msg)`: keep a work item claimed (`+WPI` within every third of the
    ack wait) while it is worked on.

    A renewal NATS cannot take (the connection being re-established) is one log line and
    tried again at the next period, never the work's failure: the work's own outcome decides
    what becomes of the item. A claim that lapsed meanwhile only lets the item come again,
    which every consumer of work items answers as done."""
    return _Claim(msg)


class _Claim:
    __slots__ = ("_claims", "_key", "msg")

    def __init__(self, msg: Msg) -> None:
        self.msg = msg

    async def __aenter__(self) -> None:
        loop = asyncio.get_running_loop()
        claims = _CLAIMS.get(loop)
        if claims is None:
            claims = _CLAIMS[loop] = _Claims()
        self._claims = claims
        self._key = claims.hold(self.msg)

    async def __aexit__(self, *_exc: object) -> None:
        self._claims.release(self._key)


class _Claims:
    """The work items held on one loop, renewed by one timer, not a timer per item (most
    items end long before their first renewal, and a timer each was measurable)."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[Msg, float]] = {}
        """Key -> (the item, when its claim was last made or renewed)."""
        self._keys = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def hold(self, msg: Msg) -> int:
        loop = asyncio.get_running_loop()
        key = next(self._keys)
        self.held[key] = (msg, loop.time())
        if self._timer is None:
            self._timer = loop.call_later(ACK_WAIT_SECONDS / 6, self._renew_due)
        return key

    def release(self, key: int) -> None:
        """The item is settled; with none held, the timer goes too (it holds the loop, the
        registry's key, so a registry left armed would keep a closed loop alive)."""
        self.held.pop(key, None)
        if not self.held and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _renew_due(self) -> None:
        """Every sixth of the ack wait, renew each claim held a sixth or more since it was
        made or renewed: each is renewed within a third of the ack wait, as with a timer of
        its own."""
        loop = asyncio.get_running_loop()
        period = ACK_WAIT_SECONDS / 6
        now = loop.time()
        for key, (msg, since) in self.held.items():
            if now - since >= period:
                self.held[key] = (msg, now)
                sending = asyncio.ensure_future(_renew(msg))
                _renewals.add(sending)
                sending.add_done_callback(_renewals.discard)
        self._timer = loop.call_later(period, self._renew_due) if self.held else None


_CLAIMS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Claims] = \
    weakref.WeakKeyDictionary()


_renewals: set[asyncio.Future[None]] = set()
"""Renewals being sent (held here so none is collected mid-way)."""


async def _renew(msg: Msg) -> None:
    try:
        await msg.in_progress()
    except NatsError as e:
        log.warning("claim of a work item not renewed", subject=msg.subject,
                    error=str(e) or type(e).__name__)
