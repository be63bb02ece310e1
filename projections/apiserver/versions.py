"""resourceVersion on a `get` or a list, and the server's `/version`.

A resourceVersion is the event log's sequence: a list's is the last sequence the read model
has folded, an object's the sequence of its own last event. The log keeps everything, so
`resourceVersion=N&resourceVersionMatch=Exact` answers the state at N for any N up to the
read model's, rebuilt from the log as `virtbus get --at N` rebuilds it (an audit read of the
asker's, `projections.audit.state_at`); a list at N is paged from N (`limit`, `continue`).
`resourceVersion` absent, `0`, or with `NotOlderThan` (or no match, kube's legacy meaning):
the state now. A resourceVersion past the read model's is waited for
`TOO_LARGE_WAIT_SECONDS`, as kube-apiserver's watch cache waits to be fresh, then answered
as kube-apiserver answers it: 504 `Timeout`, "Too large resource version", with a cause
`ResourceVersionTooLarge` and `retryAfterSeconds` 1.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

import msgspec

from events.language.query import Query
from projections.cluster import ClusterState
from projections.paging import Listed

TOO_LARGE_WAIT_SECONDS: Final = 3.0
"""kube-apiserver's wait for its cache to reach a resourceVersion (`blockTimeout`)."""
KUBERNETES_VERSION: Final = (1, 32)
"""The Kubernetes API level this server speaks (what kubectl 1.32 asks of it)."""
ARCHITECTURES: Final = {"x86_64": "amd64", "aarch64": "arm64"}
"""Go's names of machines, as `version.Info.platform` gives them."""
MATCHES: Final = ("", "Exact", "NotOlderThan")
Answer = tuple[int, str, bytes]
ListPage = Callable[[str, str], Awaitable[Answer]]
"""One page of the list, from a `continue` token and a `limit` (`projections.http.list_page`)."""


class Reader(Protocol):
    async def folded_past(self, sequence: int, timeout: float) -> int: ...

    async def listed_at(self, sequence: int, query: Query, asker: str) -> Listed: ...


def status(code: int, reason: str, message: str,
           details: dict[str, Any] | None = None) -> Answer:
    """A metav1 `Status` of a failure."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return code, "application/json", json.dumps(body).encode()


def asked(params: Mapping[str, str]) -> tuple[int, bool] | None:
    """The resourceVersion a `get` or list asks and whether exactly; None for the state now
    (none asked, or `0`); ValueError for a combination kube-apiserver refuses."""
    version, match = params.get("resourceVersion", ""), params.get("resourceVersionMatch", "")
    if match not in MATCHES:
        raise ValueError(f"resourceVersionMatch: Unsupported value: {match[:40]!r}: "
                         "supported values: \"Exact\", \"NotOlderThan\"")
    if match and not version:
        raise ValueError("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden "
                         "unless resourceVersion is provided")
    if version and not version.isdigit():
        raise ValueError(f"resourceVersion: Invalid value: {version[:40]!r}: "
                         "must be a sequence of the event log")
    if not version:
        return None
    if match == "Exact" and int(version) == 0:
        raise ValueError('resourceVersionMatch: Forbidden: resourceVersionMatch "Exact" is '
                         'forbidden for resourceVersion "0"')
    return (int(version), match == "Exact") if int(version) else None


async def answer(state: ClusterState, reader: Reader, asker: str, query: Query, *,
                 single: bool, params: Mapping[str, str], list_page: ListPage) -> Answer | None:
    """A `get` or list at the resourceVersion `params` ask; None where the state now answers
    it (`TooManyRequests` past the asker's audit reads, from `Reader.listed_at`)."""
    try:
        wanted = asked(params)
    except ValueError as e:
        return status(400, "BadRequest", str(e))
    if wanted is None:
        return None
    version, exact = wanted
    if version > state.last_sequence:
        await reader.folded_past(version - 1, TOO_LARGE_WAIT_SECONDS)
    if version > state.last_sequence:
        return status(504, "Timeout", f"Timeout: Too large resource version: {version}, "
                      f"current: {state.last_sequence}", {
                          "causes": [{"reason": "ResourceVersionTooLarge",
                                      "message": "Too large resource version"}],
                          "retryAfterSeconds": 1})
    if not exact:
        return None
    if not single:
        return await list_page(params.get("continue", "") or f"{version}.0",
                               params.get("limit", ""))
    if version == state.last_sequence:
        return None
    listed = await reader.listed_at(version, query, asker)
    if not listed.items:
        return status(404, "NotFound", f'{query.kind.lower()} "{query.name}" not found')
    return 200, "application/json", json.dumps(msgspec.msgpack.decode(listed.items[0])).encode()


def server_version() -> dict[str, str]:
    """`/version`: a Kubernetes `version.Info`, its git version the Kubernetes API level this
    server speaks with virtbus's own version as build metadata."""
    try:
        own = importlib.metadata.version("virtbus")
    except importlib.metadata.PackageNotFoundError:
        own = "0.0.0"
    major, minor = KUBERNETES_VERSION
    machine = platform.machine().lower()
    return {"major": str(major), "minor": str(minor),
            "gitVersion": f"v{major}.{minor}.0+virtbus.{own}", "gitCommit": "",
            "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "",
            "platform": f"{platform.system().lower()}/{ARCHITECTURES.get(machine, machine)}"}
