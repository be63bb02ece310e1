"""The read API's wire protocol: query/answer messages on `<p>.query.get`.

It lives in `events` because node agents ask it too (which VMIs are theirs after a restart),
and they may import nothing but `events`. An `after` sequence makes a read wait until the
read model has folded that event in, so a reader sees at least what it knows was written.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from nats.aio.client import Client

from events.subjects import Layout

QUERY_TIMEOUT_SECONDS: Final = 15.0
"""How long a reader waits for the read service to answer one query."""


class Query(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    namespace: str = ""
    name: str = ""
    after: int = 0


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    items: list[dict[str, Any]] = []
    sequence: int = 0
    error: str = ""


def query_subject(layout: Layout) -> str:
    """Where the read service answers `Query`s."""
    return f"{layout.query_root}.get"


async def ask(nc: Client, layout: Layout, query: Query,
              timeout: float = QUERY_TIMEOUT_SECONDS) -> Answer:
    """Send `query` to the read service and decode its answer (an `error` in it is left to
    the caller; a missing service raises as `nc.request` does)."""
    reply = await nc.request(query_subject(layout), msgspec.msgpack.encode(query),
                             timeout=timeout)
    return msgspec.msgpack.decode(reply.data, type=Answer)
