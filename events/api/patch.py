"""The body of a `patch` command: kubectl's patch, decided by the control plane against the
object as it is when the command is decided (`controlplane.objects.patch`)."""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

PatchType = Literal["json", "merge"]
PATCH_TYPES: Final[tuple[PatchType, ...]] = ("json", "merge")
"""`json`: RFC 6902 (a list of operations); `merge`: RFC 7386 (a JSON merge patch)."""


class PatchBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`patch`: the document and its type. `resource_version`, when given, is the object's
    sequence the client read: the patch is refused (a Conflict) if the object has changed
    since. Without `overwrite`, a merge patch that would replace a value already set (to
    another value) is refused naming it (kubectl annotate's `--overwrite`)."""

    type: PatchType
    patch: list[dict[str, Any]] | dict[str, Any]
    resource_version: str = ""
    overwrite: bool = True
