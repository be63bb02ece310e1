"""Outcome announcements: a command's outcome published on its key in the outcomes bucket,
the bucket's answer checked off the command's path.

The client awaits its outcomes on a core subscription to its keys, so it hears one as the
server routes the publish, whether or not the bucket stores it; the command's marker, stored
before the command is acked, is the record. But a person who may not read the log (one
namespace's user) looks a missed outcome up in the bucket only. So the put is not awaited,
and not forgotten either: one the bucket refuses or leaves unanswered (its stream's leader
being elected, the stream gone) is put again, a pause apart, until stored or
`MAX_PUT_ATTEMPTS` is reached, each failure one log line and counted. A put made again
stores only into an empty key: what the key holds by then is this outcome (an earlier put
stored, its answer lost) or a newer one (the marker recorded another outcome first), never
one to overwrite. Closing waits for every put's answer, so none is dropped unsaid.
"""

from __future__ import annotations

import asyncio
import functools

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from controlplane.defaults import (
    INTAKE_RETRY_SECONDS,
    MAX_PUT_ATTEMPTS,
    OUTCOME_PUT_TIMEOUT_SECONDS,
)
from events.jetstream.datastore import EXPECTED_SEQUENCE_HEADER, STALE_SEQUENCE_CODES
from events.jetstream.requests import decode_pub_ack, js_publish, requests
from events.jetstream.transient import describe
from events.language.messages import Outcome
from events.language.subjects import Layout
from events.runtime.aio import pause_unless_stopped

log = structlog.get_logger(__name__)

_encode = msgspec.msgpack.Encoder().encode
_ONLY_INTO_AN_EMPTY_KEY = {EXPECTED_SEQUENCE_HEADER: "0"}


class Announcer:
    def __init__(self, nc: Client, layout: Layout) -> None:
        self.nc = nc
        self.layout = layout
        self.stop = asyncio.Event()
        """Set by `close`: no put is made again after it."""
        self.puts_failed = 0
        """Puts the bucket refused or left unanswered (each log line carries the count)."""
        self._again: set[asyncio.Task[None]] = set()
        self._unanswered = 0
        """Puts sent whose answer has not come (each comes, at the latest at its timeout)."""
        self._all_answered = asyncio.Event()
        self._all_answered.set()

    async def announce(self, key: str, outcome: Outcome) -> None:
        """Publish `outcome` on `key`: sent when this returns, its ack checked later."""
        subject = f"$KV.{self.layout.outcomes_bucket}.{key}"
        data = _encode(outcome)
        self._unanswered += 1
        self._all_answered.clear()
        try:
            await requests(self.nc).send(
                subject, data, timeout=OUTCOME_PUT_TIMEOUT_SECONDS,
                answered=functools.partial(self._answered, subject, data))
        except BaseException:  # not sent: the caller hears of it, no answer comes
            self._answer_came()
            raise

    async def close(self) -> None:
        """Put nothing again from now on; wait for the answers to the puts sent (each within
        its timeout) and for the puts made again under way."""
        self.stop.set()
        await self._all_answered.wait()
        await asyncio.gather(*self._again, return_exceptions=True)

    def _answer_came(self) -> None:
        self._unanswered -= 1
        if not self._unanswered:
            self._all_answered.set()

    def _answered(self, subject: str, data: bytes, answer: asyncio.Future[Msg]) -> None:
        self._answer_came()
        why = _refusal(answer)
        if why is None:
            return
        if self.stop.is_set():
            self._failed(subject, why, 1, final=True)
            return
        self._failed(subject, why, 1)
        task = asyncio.ensure_future(self._put_again(subject, data))
        self._again.add(task)
        task.add_done_callback(self._again.discard)

    async def _put_again(self, subject: str, data: bytes) -> None:
        for attempt in range(2, MAX_PUT_ATTEMPTS + 1):
            await pause_unless_stopped(self.stop, INTAKE_RETRY_SECONDS)
            if self.stop.is_set():
                self._failed(subject, "the control plane is stopping", attempt, final=True)
                return
            try:
                await js_publish(self.nc, subject, data, timeout=OUTCOME_PUT_TIMEOUT_SECONDS,
                                 headers=_ONLY_INTO_AN_EMPTY_KEY)
                return
            except (NatsError, TimeoutError, msgspec.DecodeError) as e:
                if isinstance(e, APIError) and e.err_code in STALE_SEQUENCE_CODES:
                    return  # this outcome, stored unanswered, or a newer one
                self._failed(subject, describe(e), attempt)

    def _failed(self, subject: str, why: str, attempt: int, final: bool = False) -> None:
        self.puts_failed += 1
        final = final or attempt >= MAX_PUT_ATTEMPTS
        (log.error if final else log.warning)(
            "the outcomes bucket did not store an outcome" + (
                "; its marker is the record" if final else "; putting it again"),
            subject=subject, reason=why, attempt=attempt, outcome_puts_failed=self.puts_failed)


def _refusal(answer: asyncio.Future[Msg]) -> str | None:
    """Why the bucket did not store the put `answer` answers, or None if it did."""
    if answer.cancelled():
        return "cancelled"
    if (error := answer.exception()) is not None:
        return describe(error)
    msg = answer.result()
    if msg.headers and msg.headers.get("Status") == "503":
        return "no responders: the bucket's stream is not there or has no leader"
    try:
        ack = decode_pub_ack(msg.data)
    except msgspec.DecodeError as e:
        return f"an answer that is no ack: {e}"
    return None if ack.error is None else f"{ack.error.description} ({ack.error.err_code})"
