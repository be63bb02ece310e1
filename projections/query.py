"""The read API's protocol: kinds and their short names, and query/answer messages on
`<p>.query.get` and `<p>.query.list`. An `after` sequence makes a read wait until the read
model has folded that event in, so a client reads its own accepted writes."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from events.errors import InvalidSpec

KINDS: Final = {
    "VirtualMachine": ("vm", "vms", "virtualmachine", "virtualmachines"),
    "VirtualMachineInstance": ("vmi", "vmis", "virtualmachineinstance",
                               "virtualmachineinstances"),
    "Node": ("node", "nodes", "no"),
}
"""Kinds the read side serves, with the short names kubectl users type."""


def resolve_kind(text: str) -> str:
    for kind, aliases in KINDS.items():
        if text == kind or text.lower() in aliases:
            return kind
    names = ", ".join(a[0] for a in KINDS.values())
    raise InvalidSpec("kind", f"must be one of {names} (or their full names), not {text!r}")


class Query(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    namespace: str = ""
    name: str = ""
    after: int = 0


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    items: list[dict[str, Any]] = []
    sequence: int = 0
    error: str = ""
