"""The read API's wire protocol: query/answer messages on `<p>.query.<asker>.<verb>`.

Four verbs: `get` (objects now, or at a sequence or instant), `history` (one object's
events, or one request's across objects), `watch` (a page of changes from a sequence) and
`console` (a page of a VMI's serial console output).
The read service answers each as the asker may see it, so a person who may not read the
whole log (it holds every namespace and cloud-init secrets in clear) still audits and
watches what the policy lets it read. It lives in `events` because node agents ask it too
(which VMIs are theirs after a restart), and they may import nothing but `events`. An
`after` sequence makes a read wait until the read model has folded that event in, so a
reader sees at least what it knows was written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Literal, TypeVar

import msgspec
from nats.aio.client import Client

from events.language.subjects import Layout, decode_token, encode_token

A = TypeVar("A", bound=msgspec.Struct)

QUERY_TIMEOUT_SECONDS: Final = 15.0
"""How long a reader waits for the read service to answer one query."""


Verb = Literal["get", "history", "watch", "console"]
VERBS: Final[tuple[Verb, ...]] = ("get", "history", "watch", "console")
FORBIDDEN: Final = "Forbidden"
"""An answer's `reason` when the policy refused the query (Kubernetes' Status reason)."""
TOO_MANY_REQUESTS: Final = "TooManyRequests"
"""An answer's `reason` when the asker made too many audit reads (Kubernetes' 429); its
`retry_after_seconds` says when to ask again."""
NOT_FOUND: Final = "NotFound"
"""An answer's `reason` when what the query names is not there (a console of a VMI that is
not, or runs on no node)."""
WATCH_PAGE: Final = 256
"""The most changes one `watch` answer holds; the next page starts where it ended."""


class Query(msgspec.Struct, frozen=True, kw_only=True):
    """`get`: objects of a kind (in a namespace, by name), now or as they stood `at` a
    sequence or an instant (rebuilt from the log)."""

    kind: str
    namespace: str = ""
    name: str = ""
    after: int = 0
    at: int | datetime | None = None
    node: str = ""
    """VMIs only: those placed on this node ('' for all), as virt-handler lists its own
    with the `kubevirt.io/nodeName` selector: a node agent's list stays its node's size."""
    continue_: str = msgspec.field(default="", name="continue")
    """The token of the page to answer, from the answer before (`projections.paging`)."""


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    items: list[dict[str, Any]] = []
    sequence: int = 0
    continue_: str = msgspec.field(default="", name="continue")
    """The token of the next page; '' after the last (kube-apiserver's list `continue`)."""
    error: str = ""
    reason: str = ""
    """`FORBIDDEN` when the policy refused it, `TOO_MANY_REQUESTS` when the asker must wait;
    '' for any other error."""
    retry_after_seconds: int = 0


class HistoryQuery(msgspec.Struct, frozen=True, kw_only=True):
    """`history`: one object's events (kind and name), or every event one request caused
    (`correlation`), with who caused each and what it changed."""

    kind: str = ""
    namespace: str = ""
    name: str = ""
    correlation: str = ""


class HistoryEntry(msgspec.Struct, frozen=True):
    sequence: int
    time: str
    actor: str
    type: str
    command_id: str
    correlation_id: str
    changes: list[dict[str, Any]]
    """A JSON Patch (RFC 6902) from the object before to after, as the asker may see both."""
    object: str = ""
    """The aggregate (`kind.namespace.name`), where entries span objects."""


class HistoryAnswer(msgspec.Struct, frozen=True, kw_only=True):
    entries: list[HistoryEntry] = []
    error: str = ""
    reason: str = ""
    retry_after_seconds: int = 0


class WatchQuery(msgspec.Struct, frozen=True, kw_only=True):
    """`watch`: the changes to objects of a kind from `since` (a sequence, an instant, or
    None for the log's head), a page at a time; the answer waits a while for the first."""

    kind: str
    namespace: str = ""
    name: str = ""
    since: int | datetime | None = None


class Change(msgspec.Struct, frozen=True):
    """One step of a status stream: an event and the object as it stood after it (None once
    deleted), as the asker may see it."""

    sequence: int
    type: str
    time: datetime
    actor: str
    namespace: str
    name: str
    object: dict[str, Any] | None


class WatchAnswer(msgspec.Struct, frozen=True, kw_only=True):
    changes: list[Change] = []
    next: int = 0
    """Where the next page starts: past every event this answer covered."""
    error: str = ""
    reason: str = ""
    retry_after_seconds: int = 0


class ConsoleQuery(msgspec.Struct, frozen=True, kw_only=True):
    """`console`: the serial console output of the VMI's current instance, from `since` (a
    position an earlier answer gave as `next`; 0 for the oldest kept)."""

    namespace: str
    name: str
    since: int = 0


class ConsoleAnswer(msgspec.Struct, frozen=True, kw_only=True):
    output: bytes = b""
    """The console's bytes as the guest wrote them (not decoded: a console is a terminal)."""
    next: int = 0
    """Where the next page starts: past everything this answer holds."""
    more: bool = False
    """More output is kept past this page: ask again at once."""
    phase: str = ""
    """The VMI's phase: a follower stops once it is finished and nothing more is kept."""
    error: str = ""
    reason: str = ""
    retry_after_seconds: int = 0


def query_subject(layout: Layout, asker: str, verb: Verb = "get") -> str:
    """Where `asker` sends its queries: `<p>.query.<asker>.<verb>`. Each NATS user may
    publish only under its own name (`events.authorization.accounts`), so the read service can
    answer by who asks."""
    return f"{layout.query_root}.{encode_token(asker)}.{verb}"


def queries_filter(layout: Layout) -> str:
    """Every asker's queries: what the read service subscribes to."""
    return f"{layout.query_root}.*.*"


def query_asker(layout: Layout, subject: str) -> tuple[str, str]:
    """Who asks, and the verb, from a `query_subject` (the server's permissions vouch for
    the asker)."""
    asker, _, verb = subject.removeprefix(f"{layout.query_root}.").partition(".")
    return decode_token(asker), verb


async def ask(nc: Client, layout: Layout, query: Query, asker: str,
              timeout: float = QUERY_TIMEOUT_SECONDS) -> Answer:
    """Send a `get` query to the read service as `asker` and decode its answer, every page
    of it (`projections.paging`) as one; an `error` in it is left to the caller, and a
    missing service raises as `nc.request` does."""
    answer = await ask_verb(nc, layout, asker, "get", query, answer=Answer, timeout=timeout)
    items = answer.items
    while answer.continue_ and not answer.error:
        answer = await ask_verb(nc, layout, asker, "get",
                                msgspec.structs.replace(query, continue_=answer.continue_),
                                answer=Answer, timeout=timeout)
        items = items + answer.items
    return msgspec.structs.replace(answer, items=items)


async def ask_verb(nc: Client, layout: Layout, asker: str, verb: Verb, query: msgspec.Struct,
                   *, answer: type[A], timeout: float = QUERY_TIMEOUT_SECONDS) -> A:
    """Send any verb's query as `asker`; its answer decoded as `answer`."""
    reply = await nc.request(query_subject(layout, asker, verb), msgspec.msgpack.encode(query),
                             timeout=timeout)
    return msgspec.msgpack.decode(reply.data, type=answer)
