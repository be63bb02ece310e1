"""JetStream Direct Get, batched: the read primitive of the store, of replay and of history.

One request returns up to `limit` messages (the server streams them to an inbox and ends
with a 204 status), so reading a log costs one round trip per page, not per message; and
one request looks up many subjects' newest messages (`LastLookups`).

An answer is many messages, and the client may drop some on the way (nats-py drops what
arrives while a subscription's pending limit is full, a slow consumer). The server chains
each message of an answer to the one it sent before (`Nats-Last-Sequence`, 0 for the first)
and the end to the last; a broken chain is a message lost, and the read asks again from
there, so a lost message never reads as the log's end or as a subject with none.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Final

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from events.jetstream.requests import request, requests

PAGE: Final = 1000
TIMEOUT: Final = 10.0
MULTI_LAST_MAX: Final = 256
"""Subjects asked in one multi-last Direct Get (the server refuses an answer of more than
1,024 messages)."""

_encode_json = msgspec.json.Encoder().encode


class DirectGetError(RuntimeError):
    pass


LOST_ASKS: Final = 3
"""Answers in a row that lose their first message on the way (so the read gains nothing)
before it gives up (`MessagesLost`)."""


class MessagesLost(DirectGetError):
    """`LOST_ASKS` answers in a row lost their first message on the way: a slow consumer,
    transient (`events.jetstream.transient`)."""


async def direct_batch(nc: Client, stream: str, start: int, limit: int, subject: str) -> list[Msg]:
    """Up to `limit` messages on `subject` (wildcards allowed) from sequence `start`; fewer
    only where the log holds no more.

    Asked through the connection's one inbox (`Requests.request_stored`): one future per
    page, not one wait per message (which cost half the replay time in nats-py's
    `next_msg`), and no subscription of its own. The server ends a batch early once it has
    sent its byte limit (`max_pending`, 64 MB: a page of large events), its end then
    counting what is left; the read goes on from there, or a short page would read as the
    log's end.
    """
    out: list[Msg] = []
    lost = 0
    while True:
        asked = {"seq": max(start, 1), "batch": limit - len(out), "next_by_subj": subject}
        page, end = await requests(nc).request_stored(f"$JS.API.DIRECT.GET.{stream}",
                                                      _encode_json(asked), timeout=TIMEOUT)
        status = _status(end)
        if status not in ("204", "404"):
            raise DirectGetError(f"direct get of {stream} failed with status {status}")
        kept, whole = _intact(page, end)
        out.extend(kept)
        if whole and (not page or len(out) >= limit or _pending(end) == 0):
            return out
        lost = 0 if kept else _lost_again(lost, stream)
        if kept:
            start = sequence(kept[-1]) + 1


async def last_on(nc: Client, stream: str, subject: str) -> Msg | None:
    """The newest message on `subject` (wildcards allowed), or None."""
    return await _one(nc, stream, {"last_by_subj": subject})


async def last_by_subject(nc: Client, stream: str, subject: str) -> Msg | None:
    """The newest message on `subject` (no wildcards), asked with the subject in the
    request's own subject, so a NATS permission can pin what a user may read this way."""
    msg = await request(nc, f"$JS.API.DIRECT.GET.{stream}.{subject}", timeout=TIMEOUT)
    return _found(msg)


async def first_since(nc: Client, stream: str, subject: str, at: datetime) -> Msg | None:
    """The first message on `subject` stored at or after `at`, or None."""
    stamp = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return await _one(nc, stream, {"start_time": stamp, "next_by_subj": subject})


async def _one(nc: Client, stream: str, asked: dict[str, str]) -> Msg | None:
    msg = await request(nc, f"$JS.API.DIRECT.GET.{stream}", _encode_json(asked),
                        timeout=TIMEOUT)
    return _found(msg)


class LastLookups:
    """`last_on` for literal subjects of one stream, every look-up made in one turn of the
    event loop asked together, as one multi-last Direct Get (or several, past
    `MULTI_LAST_MAX` subjects).

    The write path looks up each command's marker while deciding it, nearly always to find
    none: one request and one answer per command were ~7 % of the control plane's time.
    Each look-up still gets its own answer (the subject's newest message, or None) or the
    request's error; "none" only from an answer the server ended cleanly."""

    def __init__(self, nc: Client, stream: str) -> None:
        self.nc = nc
        self.stream = stream
        self._turn: dict[str, list[asyncio.Future[Msg | None]]] = {}
        """This turn's look-ups, by subject, asked when the turn ends."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asking: set[asyncio.Task[None]] = set()

    def last_on(self, subject: str) -> asyncio.Future[Msg | None]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a turn left by a loop that stopped is never asked
            self._loop, self._turn = loop, {}
        if not self._turn:
            loop.call_soon(self._ask_turn)
        found: asyncio.Future[Msg | None] = loop.create_future()
        self._turn.setdefault(subject, []).append(found)
        return found

    def _ask_turn(self) -> None:
        turn, self._turn = self._turn, {}
        subjects = list(turn)
        for at in range(0, len(subjects), MULTI_LAST_MAX):
            task = asyncio.ensure_future(
                self._ask({s: turn[s] for s in subjects[at:at + MULTI_LAST_MAX]}))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _ask(self, asked: dict[str, list[asyncio.Future[Msg | None]]]) -> None:
        try:
            newest = await self._newest(list(asked))
        except asyncio.CancelledError:  # the loop stopping: no look-up is left waiting
            for waiting in asked.values():
                for found in waiting:
                    found.cancel()
            raise
        except Exception as e:  # every look-up of the request fails with it
            for waiting in asked.values():
                for found in waiting:
                    if not found.done():
                        found.set_exception(e)
            return
        for subject, waiting in asked.items():
            for found in waiting:
                if not found.done():  # its caller may have gone on without it
                    found.set_result(newest.get(subject))

    async def _newest(self, subjects: list[str]) -> dict[str, Msg]:
        """The newest message of each of `subjects` that has one. An answer the server cut
        short past its byte limit (its end counts what it left out) is asked on for the
        subjects it did not answer."""
        newest: dict[str, Msg] = {}
        left = subjects
        lost = 0
        while True:
            stored, end = await requests(self.nc).request_stored(
                f"$JS.API.DIRECT.GET.{self.stream}", _encode_json({"multi_last": left}),
                timeout=TIMEOUT)
            status = _status(end)
            if status == "404" and not stored and _description(end) == "No Results":
                return newest  # none of them holds a message (not one that failed to load)
            if status != "204":
                raise DirectGetError(f"direct get of {self.stream} failed with status "
                                     f"{status} {_description(end)}".rstrip())
            for msg in stored:  # each names its subject: a gap before it takes nothing away
                newest[(msg.headers or {}).get("Nats-Subject", "")] = msg
            _kept, whole = _intact(stored, end)
            if whole and _pending(end) == 0:
                return newest
            unanswered = [s for s in left if s not in newest]
            if len(unanswered) == len(left) and whole:  # never ask the same again
                raise DirectGetError(f"direct get of {self.stream} ended with messages left "
                                     "and none of them sent")
            lost = 0 if len(unanswered) < len(left) else _lost_again(lost, self.stream)
            left = unanswered


def _found(msg: Msg) -> Msg | None:
    """A Direct Get's stored message, None for its 404, or its failure raised."""
    status = _status(msg)
    if status is None:
        return msg
    if status == "404":
        return None
    raise DirectGetError(f"direct get failed: {msg.headers}")


def _status(msg: Msg) -> str | None:
    """The server's status of a Direct Get answer, or None for a stored message: that has its
    sequence, whatever else it carries (a stray stored in the log may hold a status line)."""
    headers = msg.headers or {}
    return None if "Nats-Sequence" in headers else headers.get("Status", "")


def _intact(stored: list[Msg], end: Msg) -> tuple[list[Msg], bool]:
    """The messages of a batched answer up to the first one lost on the way, and whether
    none was: each names the sequence sent before it (`Nats-Last-Sequence`, 0 for the
    first) and the end names the last. A server that names none is taken at its word."""
    previous = 0
    for at, msg in enumerate(stored):
        if _sent_before(msg) not in (None, previous):
            return stored[:at], False
        previous = sequence(msg)
    return stored, _sent_before(end) in (None, previous)


def _lost_again(lost: int, stream: str) -> int:
    """One more answer in a row that gained nothing, its first message lost on the way;
    `MessagesLost` at the `LOST_ASKS`th."""
    if lost + 1 >= LOST_ASKS:
        raise MessagesLost(f"direct get of {stream}: {LOST_ASKS} answers in a row lost "
                           "their first message on the way (a slow consumer)")
    return lost + 1


def _description(msg: Msg) -> str:
    return (msg.headers or {}).get("Description", "")


def _sent_before(msg: Msg) -> int | None:
    named = (msg.headers or {}).get("Nats-Last-Sequence")
    return int(named) if named is not None else None


def _pending(end: Msg) -> int:
    """How many messages a batched Direct Get's end says it did not send."""
    return int((end.headers or {}).get("Nats-Num-Pending", "0"))


def sequence(msg: Msg) -> int:
    return int((msg.headers or {})["Nats-Sequence"])


async def pages(nc: Client, stream: str, subject: str,
                start: int = 1) -> AsyncGenerator[list[Msg], None]:
    """The messages on `subject` from `start` to the stream's end, a page at a time, so a
    reader that has what it needs stops reading."""
    while True:
        page = await direct_batch(nc, stream, start, PAGE, subject)
        yield page
        if len(page) < PAGE:
            return
        start = sequence(page[-1]) + 1


async def read_all(nc: Client, stream: str, subject: str, start: int = 1,
                   stop: int | None = None) -> list[Msg]:
    """Every message on `subject` from `start` (to `stop`, inclusive)."""
    out: list[Msg] = []
    if stop is not None and start > stop:
        return out
    async for page in pages(nc, stream, subject, start):
        out.extend(m for m in page if stop is None or sequence(m) <= stop)
        if stop is not None and page and sequence(page[-1]) >= stop:
            break
    return out
