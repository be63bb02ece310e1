"""JetStream Direct Get, batched: the read primitive of the store, of replay and of history.

One request returns up to `limit` messages (the server streams them to an inbox and ends
with a 204 status), so reading a log costs one round trip per page, not per message.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Final

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from events.requests import request

PAGE: Final = 1000
TIMEOUT: Final = 10.0

_encode_json = msgspec.json.Encoder().encode


class DirectGetError(RuntimeError):
    pass


async def direct_batch(nc: Client, stream: str, start: int, limit: int, subject: str) -> list[Msg]:
    """Up to `limit` messages on `subject` (wildcards allowed) from sequence `start`.

    Messages are collected by the subscription's callback and the page completes on the
    server's end-of-batch status: one future per page, not one wait per message (which
    cost half the replay time in nats-py's `next_msg`).
    """
    out: list[Msg] = []
    end: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def collect(msg: Msg) -> None:
        status = _status(msg)
        if status is None:
            out.append(msg)
        elif not end.done():
            end.set_result(status)

    sub = await nc.subscribe(nc.new_inbox(), cb=collect)
    try:
        asked = {"seq": max(start, 1), "batch": limit, "next_by_subj": subject}
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", _encode_json(asked),
                         reply=sub.subject)
        status = await asyncio.wait_for(end, TIMEOUT)
    finally:
        await sub.unsubscribe()
    if status not in ("204", "404"):
        raise DirectGetError(f"direct get of {stream} failed with status {status}")
    return out


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
