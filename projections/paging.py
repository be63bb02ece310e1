"""A `get` answer a page at a time, as kube-apiserver answers a list with `limit` and
`continue`: one answer is one NATS message, and a list of 10,000 VMs is many times what a
message may hold (the server's `max_payload`, 1 MiB by default).

Every page of one list is cut from the same rendering, at the sequence of the first page:
the token `continue` names that sequence and the offset of the next item. The read service
keeps the last few lists that had pages left (`LISTS_KEPT`), so a further page costs only
its cut; one no longer kept is rendered again at that sequence (the same list: the log does
not change behind it), so a page is never taken from another state than the first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, Final, NamedTuple

import msgspec

LISTS_KEPT: Final = 2
"""Rendered lists kept for their further pages (10,000 VMs are about 50 MB as dicts)."""
PAGE_SHARE: Final = 0.75
"""The share of the server's `max_payload` a page's items may take: the rest is the answer
around them."""


class Continuation(NamedTuple):
    """Where the next page of a list starts: the list's sequence and the item's offset."""

    sequence: int
    offset: int

    def token(self) -> str:
        return f"{self.sequence}.{self.offset}"


def parse_continue(token: str) -> Continuation | None:
    """The continuation `token` names; None for ''; ValueError naming the rule otherwise."""
    if not token:
        return None
    sequence, _, offset = token.partition(".")
    if not (sequence.isdigit() and offset.isdigit() and len(token) <= 40):
        raise ValueError(f"continue: not a token this service gave, {token[:40]!r}")
    return Continuation(int(sequence), int(offset))


class Listed(NamedTuple):
    """One rendering of a list, each item encoded as it goes on the wire: its size is what
    a page's cut counts, and a kept list holds bytes, not the thousands of dicts the
    collector would walk while it is kept."""

    items: list[msgspec.Raw]

    @classmethod
    def of(cls, items: list[dict[str, Any]]) -> Listed:
        return cls([msgspec.Raw(msgspec.msgpack.encode(item)) for item in items])


class ListPages:
    """The lists whose further pages may still be asked for, newest kept: `kept` in all, and
    at most `kept_each` of one asker (the first part of a key), so that one asker paging
    many lists does not push another's out (0: no bound of its own)."""

    def __init__(self, kept: int = LISTS_KEPT, kept_each: int = 0) -> None:
        self.kept = kept
        self.kept_each = kept_each
        self._lists: OrderedDict[tuple[tuple[Hashable, ...], int], Listed] = OrderedDict()

    def get(self, key: tuple[Hashable, ...], sequence: int) -> Listed | None:
        found = self._lists.get((key, sequence))
        if found is not None:
            self._lists.move_to_end((key, sequence))
        return found

    def page(self, key: tuple[Hashable, ...], sequence: int, listed: Listed, offset: int, *,
             budget: int = 0, limit: int = 0) -> tuple[list[msgspec.Raw], str]:
        """The items from `offset` that fit in `budget` bytes and number at most `limit`
        (one at least; 0: no bound), and the token of the next page ('' after the last); a
        list with pages left is kept."""
        end, used = offset, 0
        while end < len(listed.items) and (end == offset or (
                (not budget or used + len(listed.items[end]) <= budget)
                and (not limit or end - offset < limit))):
            used += len(listed.items[end])
            end += 1
        if end >= len(listed.items):
            return listed.items[offset:], ""
        self._lists[(key, sequence)] = listed
        self._lists.move_to_end((key, sequence))
        if self.kept_each:
            own = [kept for kept in self._lists if kept[0][0] == key[0]]
            for oldest in own[:-self.kept_each]:
                del self._lists[oldest]
        while len(self._lists) > self.kept:
            self._lists.popitem(last=False)
        return listed.items[offset:end], Continuation(sequence, end).token()
