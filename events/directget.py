"""JetStream Direct Get, batched: the read primitive of the store, of replay and of history.

One request returns up to `limit` messages (the server streams them to an inbox and ends
with a 204 status), so reading a log costs one round trip per page, not per message.
"""

from __future__ import annotations

import contextlib
from typing import Final

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

PAGE: Final = 1000
TIMEOUT: Final = 10.0

_encode_json = msgspec.json.Encoder().encode


class DirectGetError(RuntimeError):
    pass


async def direct_batch(nc: Client, stream: str, start: int, limit: int, subject: str) -> list[Msg]:
    """Up to `limit` messages on `subject` (wildcards allowed) from sequence `start`."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        request = {"seq": max(start, 1), "batch": limit, "next_by_subj": subject}
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", _encode_json(request), reply=inbox)
        out: list[Msg] = []
        while True:
            msg = await sub.next_msg(timeout=TIMEOUT)
            headers = msg.headers or {}
            if "Status" in headers:
                if headers["Status"] not in ("204", "404"):
                    raise DirectGetError(f"direct get failed: {headers}")
                return out
            out.append(msg)
            if len(out) == limit:
                # The server still sends its end-of-batch marker; drain it.
                with contextlib.suppress(TimeoutError):
                    await sub.next_msg(timeout=TIMEOUT)
                return out
    finally:
        await sub.unsubscribe()


async def last_on(nc: Client, stream: str, subject: str) -> Msg | None:
    """The newest message on `subject` (wildcards allowed), or None."""
    msg = await nc.request(
        f"$JS.API.DIRECT.GET.{stream}", _encode_json({"last_by_subj": subject}), timeout=TIMEOUT
    )
    headers = msg.headers or {}
    if "Status" in headers:
        if headers["Status"] == "404":
            return None
        raise DirectGetError(f"direct get failed: {headers}")
    return msg


def sequence(msg: Msg) -> int:
    return int((msg.headers or {})["Nats-Sequence"])


async def read_all(nc: Client, stream: str, subject: str, start: int = 1,
                   stop: int | None = None) -> list[Msg]:
    """Every message on `subject` from `start` (to `stop`, inclusive)."""
    out: list[Msg] = []
    while stop is None or start <= stop:
        page = await direct_batch(nc, stream, start, PAGE, subject)
        out.extend(m for m in page if stop is None or sequence(m) <= stop)
        if len(page) < PAGE:
            break
        start = sequence(page[-1]) + 1
    return out
