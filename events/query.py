"""The read API's wire protocol: query/answer messages on `<p>.query.get`.

It lives in `events` because node agents ask it too (which VMIs are theirs after a restart),
and they may import nothing but `events`. An `after` sequence makes a read wait until the
read model has folded that event in, so a reader sees at least what it knows was written.
"""

from __future__ import annotations

from typing import Any

import msgspec

from events.subjects import Layout


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
