"""Content negotiation as kube-apiserver does it: the `Accept` header lists media types in
the client's order of preference (kubectl asks for aggregated discovery or a `Table` first,
then plain JSON), and the server answers the first one it serves. aiohttp parses each media
type; this only picks."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from aiohttp.helpers import parse_mimetype

T = TypeVar("T")

JSON = "application/json"


def first_served(accept: str, serves: Callable[[str, dict[str, str]], T | None],
                 otherwise: T) -> T:
    """What `serves` makes of the first media type in `accept` it serves (it is given
    `type/subtype` and the parameters), else `otherwise` (no header: plain JSON)."""
    for media in _media_types(accept):
        mime = parse_mimetype(media)
        answer = serves(f"{mime.type}/{mime.subtype}".lower(), dict(mime.parameters))
        if answer is not None:
            return answer
    return otherwise


def plain_json(media: str, params: dict[str, str]) -> bool:
    """JSON with no `as` parameter asking for another shape, or any type at all."""
    return media in (JSON, "*/*", "application/*") and "as" not in params


def _media_types(accept: str) -> Iterable[str]:
    return (part.strip() for part in accept.split(",") if part.strip())

