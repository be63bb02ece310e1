"""What a failed NATS call means to a loop: transient (the connection is being re-established,
a server of the cluster is gone, a JetStream leader is being elected: pause and try again) or
not (a refusal that asking again cannot change: raise it).

Every long-running loop that talks to NATS asks `is_transient` and retries through
`retry_until_stopped` (a service: until it works or the process stops),
`retry_while_running` (a step of work: until it works; once the process stops, the last
error, so the work stays undone) or `retry_within` (set-up and a person's commands: for a
bounded time, then the last error). Each failed
attempt is one log line, with what failed, the attempt and the reason: never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import structlog
from nats.errors import (
    ConnectionReconnectingError,
    NoRespondersError,
    OutboundBufferLimitError,
    SlowConsumerError,
    StaleConnectionError,
)
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

from events.jetstream.directget import MessagesLost

log = structlog.get_logger(__name__)

T = TypeVar("T")

TRANSIENT_API_CODES: Final = frozenset({
    10008,  # JetStream system temporarily unavailable (no meta leader, or none yet)
    10009,  # JetStream cluster can not handle request (this server is not the leader)
    10014,  # consumer not found: its assignment not yet known here during an election
    10059,  # stream not found: the same, for a stream
    10118,  # stream is offline
    10119,  # consumer is offline
})
"""JetStream API errors a cluster answers while it elects leaders after losing a server."""
TRANSIENT_ERRORS: Final = (
    TimeoutError,  # no answer in time: asyncio's, nats-py's (flush and fetch too)
    NoRespondersError,  # nobody listens on the subject now (a service reconnecting)
    NoStreamResponseError,  # the same, for a stream (its leader being elected)
    StaleConnectionError,  # the server went away; the connection is re-established
    ConnectionReconnectingError,
    OutboundBufferLimitError,  # too much written while reconnecting
    SlowConsumerError,
    MessagesLost,  # a batched read's answer lost its first message: the same, for a read
    ServiceUnavailableError,
)
"""Failures of a connection that reconnects. A *closed* connection (`ConnectionClosedError`,
`NoServersError`: closed by this process, or out of reconnect attempts) never comes back,
so it is not among them."""
FIRST_PAUSE_SECONDS: Final = 0.25
"""The pause after a first transient failure, doubled per attempt up to `MAX_PAUSE_SECONDS`."""
MAX_PAUSE_SECONDS: Final = 2.0
"""A cluster elects a new leader within seconds: never wait much longer than that to look."""


def is_transient(error: BaseException) -> bool:
    """Whether asking again later may succeed: no answer in time, a connection being
    re-established, nobody listening (yet), a JetStream leader being elected; an error
    raised because of one of those (`raise ... from`) too. Not a JetStream refusal (a bad
    request, a wrong last sequence, a key that is not there), not a closed connection, and
    nothing met while the task is being cancelled (a cleanup that failed on its way out
    must not keep a cancelled loop retrying)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop: nothing is being cancelled
        task = None
    if task is not None and task.cancelling():
        return False
    return _transient(error)


def _transient(error: BaseException) -> bool:
    if isinstance(error, TRANSIENT_ERRORS):
        return True
    if isinstance(error, APIError):  # its subclasses do not all set `code` and `err_code`
        return (getattr(error, "code", None) == 503
                or getattr(error, "err_code", None) in TRANSIENT_API_CODES)
    cause = error.__cause__
    return cause is not None and cause is not error and _transient(cause)


def describe(error: BaseException) -> str:
    """A transient error in a few words, for its log line."""
    name = type(error).__name__
    if isinstance(error, ServiceUnavailableError):
        return f"{name}: JetStream unavailable"
    if isinstance(error, APIError):
        code = getattr(error, "err_code", None) or getattr(error, "code", None)
        text = getattr(error, "description", None) or str(error).removeprefix("nats: ")
        return f"{name} {code}: {text}" if code else f"{name}: {text}"
    text = str(error).removeprefix("nats: ").strip()
    return f"{name}: {text}" if text else name


def pause_for(attempt: int) -> float:
    """How long to wait after the `attempt`th transient failure in a row (1-based)."""
    return float(min(FIRST_PAUSE_SECONDS * 2 ** (attempt - 1), MAX_PAUSE_SECONDS))


def note(what: str, error: BaseException, attempt: int, **context: Any) -> float:
    """Log one line for a transient failure of `what`; the pause before the next attempt."""
    pause = pause_for(attempt)
    log.warning(f"{what}: NATS unavailable; retrying", attempt=attempt,
                error=describe(error), retry_in=pause, **context)
    return pause


async def retry_until_stopped(call: Callable[[], Awaitable[T]], what: str,
                              stop: asyncio.Event, **context: Any) -> T | None:
    """`call()`'s result, retried after each transient failure until it succeeds; None if
    `stop` is set first. What is not transient is raised at once."""
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as e:
            if not is_transient(e):
                raise
            attempt += 1
            pause = note(what, e, attempt, **context)
        if stop.is_set():
            return None
        await _pause(stop, pause)
        if stop.is_set():
            return None


async def retry_within(call: Callable[[], Awaitable[T]], what: str, seconds: float,
                       **context: Any) -> T:
    """`call()`'s result, retried after each transient failure for up to `seconds`; then
    the last failure is raised, and so is at once what is not transient."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as e:
            attempt += 1
            if not is_transient(e) or loop.time() + pause_for(attempt) > deadline:
                raise
            await asyncio.sleep(note(what, e, attempt, **context))  # back-off, not a wait


async def retry_while_running(call: Callable[[], Awaitable[T]], what: str,
                              stop: asyncio.Event, **context: Any) -> T:
    """`call()`'s result, retried after each transient failure until it succeeds; once
    `stop` is set, the last failure is raised instead, so that work NATS would not take is
    left undone (not acknowledged, not recorded) as if NATS had failed it. What is not
    transient is raised at once."""
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as e:
            if not is_transient(e) or stop.is_set():
                raise
            attempt += 1
            await _pause(stop, note(what, e, attempt, **context))
            if stop.is_set():
                raise


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """The back-off between attempts, cut short by `stop`."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
