"""The read API's wire protocol: query/answer messages on `<p>.query.<asker>.get`.

It lives in `events` because node agents ask it too (which VMIs are theirs after a restart),
and they may import nothing but `events`. An `after` sequence makes a read wait until the
read model has folded that event in, so a reader sees at least what it knows was written.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from nats.aio.client import Client

from events.subjects import Layout, decode_token, encode_token

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


def query_subject(layout: Layout, asker: str) -> str:
    """Where `asker` sends its `Query`s: `<p>.query.<asker>.get`. Each NATS user may publish
    only under its own name (`events.authorization`), so the read service can answer by
    who asks."""
    return f"{layout.query_root}.{encode_token(asker)}.get"


def queries_filter(layout: Layout) -> str:
    """Every asker's queries: what the read service subscribes to."""
    return f"{layout.query_root}.*.get"


def query_asker(layout: Layout, subject: str) -> str:
    """Who asks, from a `query_subject` (the server's permissions vouch for it)."""
    return decode_token(subject.removeprefix(f"{layout.query_root}.").split(".", 1)[0])


async def ask(nc: Client, layout: Layout, query: Query, asker: str,
              timeout: float = QUERY_TIMEOUT_SECONDS) -> Answer:
    """Send `query` to the read service as `asker` and decode its answer (an `error` in it
    is left to the caller; a missing service raises as `nc.request` does)."""
    reply = await nc.request(query_subject(layout, asker), msgspec.msgpack.encode(query),
                             timeout=timeout)
    return msgspec.msgpack.decode(reply.data, type=Answer)
