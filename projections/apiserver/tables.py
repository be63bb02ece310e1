"""Server-side printing: a list or an object answered as a `meta.k8s.io/v1` `Table` when the
client asks for one (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`, as `kubectl get`
does), so kubectl prints each kind's declared columns (`Kind.columns`) without knowing the
kind.

Shaped as kube-apiserver's converter for a CustomResourceDefinition's printer columns: each
column's definition carries its name, type, description and priority (kubectl shows priority
above 0 only with `-o wide`); the name column has format `name` (kubectl prefixes it with the
kind for `get vm,vmi`); a `date` cell is the object's age as kube-apiserver words it (`5m`,
`3h12m`: `human_duration`), computed when the table is made, as there. Each row carries its
object as `includeObject` asks: its metadata (`PartialObjectMetadata`, the default: kubectl
reads the namespace from it for `-A`), the whole object (`Object`), or none (`None`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

from events.api.kinds import Column, Kind
from projections.apiserver.media import JSON, first_served, plain_json

TABLE_VERSION: Final = "meta.k8s.io/v1"
INCLUDE_OBJECT: Final = ("Metadata", "Object", "None")
"""`includeObject`'s values; an empty one is `Metadata`."""
MINUTE: Final = 60
HOUR: Final = 60 * MINUTE
DAY: Final = 24 * HOUR
YEAR: Final = 365 * DAY


def wants_table(accept: str) -> bool:
    """Whether the first media type in `accept` this server serves is a v1 `Table`."""
    def serves(media: str, params: dict[str, str]) -> bool | None:
        if media == JSON and (params.get("as"), params.get("v"), params.get("g")) == (
                "Table", "v1", "meta.k8s.io"):
            return True
        return False if plain_json(media, params) else None
    return first_served(accept, serves, False)


def human_duration(seconds: float) -> str:
    """An age as apimachinery's `duration.HumanDuration` words it: two or three significant
    figures (`90s`, `5m12s`, `3h12m`, `2d4h`, `1y20d`)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 2 * MINUTE:
        return f"{s}s"
    minutes, hours, days = s // MINUTE, s // HOUR, s // DAY
    if minutes < 10:
        return f"{minutes}m{s % MINUTE}s" if s % MINUTE else f"{minutes}m"
    if minutes < 3 * 60:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    if days < 365 * 8:
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{days // 365}y"


def column_definition(column: Column) -> dict[str, Any]:
    """metav1 `TableColumnDefinition` of a declared printer column."""
    return {"name": column.name, "type": column.type,
            "format": "name" if column.json_path == ".metadata.name" else "",
            "description": column.description or
            f"Custom resource definition column (in JSONPath format): {column.json_path}",
            "priority": column.priority}


def cell(column: Column, obj: dict[str, Any], now: datetime) -> Any:
    """A column's cell: its value as its type (None where it has none, or another type), a
    date as an age."""
    value = column.cell(obj)
    if value is None:
        return None
    match column.type:
        case "date":
            try:
                created = datetime.fromisoformat(str(value))
            except ValueError:
                return "<invalid>"
            return human_duration((now - created).total_seconds())
        case "string":
            return value if isinstance(value, str) else json.dumps(value)
        case "boolean":
            return value if isinstance(value, bool) else None
        case "integer":
            return int(value) if isinstance(value, int | float) else None
        case "number":
            return float(value) if isinstance(value, int | float) else None
    return None


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": TABLE_VERSION,
            "metadata": obj.get("metadata", {})}


def table(kind: Kind, answer: dict[str, Any], include_object: str = "",
          now: datetime | None = None) -> dict[str, Any]:
    """The `Table` of a list (`items`, its metadata's resourceVersion and continue) or of one
    object, with `kind`'s columns."""
    now = now or datetime.now(UTC)
    single = "items" not in answer
    objects: list[dict[str, Any]] = [answer] if single else answer["items"]
    listed = answer.get("metadata", {})
    metadata = {k: v for k, v in listed.items()
                if k in ("resourceVersion", "continue", "remainingItemCount")}
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [cell(c, obj, now) for c in kind.columns]}
        if (shown := _row_object(obj, include_object)) is not None:
            row["object"] = shown
        rows.append(row)
    return {"kind": "Table", "apiVersion": TABLE_VERSION, "metadata": metadata,
            "columnDefinitions": [column_definition(c) for c in kind.columns], "rows": rows}


def negotiated(kind: Kind, answer: tuple[int, str, bytes], accept: str,
               include_object: str) -> tuple[int, str, bytes]:
    """A successful JSON answer of a list or an object, as a `Table` if `accept` asks one
    first; any other answer as it is."""
    code, _, body = answer
    if code != 200 or not wants_table(accept):
        return answer
    return 200, JSON, json.dumps(table(kind, json.loads(body), include_object)).encode()
