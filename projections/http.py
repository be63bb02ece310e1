"""The HTTP read API: the read model at kube-apiserver-shaped paths, plus `/metrics`.

| path                                                               | answer             |
|--------------------------------------------------------------------|--------------------|
| `/apis/{group}/{version}/{plural}` (`/api/v1/...`: the core group) | every namespace's  |
| `/apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}]`        | list or one object |
| `/apis/{group}/{version}/{plural}/{name}` (a cluster-scoped kind)  | one object         |
| `/api[/v1]`, `/apis[/{group}[/{version}]]`                         | discovery          |
| `/openapi/v3[/api/v1, /apis/{group}/{version}]`                    | OpenAPI v3         |
| `/metrics`                                                         | Prometheus text    |
| `/healthz`, `/readyz`, `/livez`                                    | `ok`               |
| `/version`                                                         | a `version.Info`   |

Every kind declared in `events.api.kinds` is served at its group, versions and plural
(`/apis/kubevirt.io/v1/namespaces/default/virtualmachines`, `/api/v1/nodes`).

Discovery and OpenAPI are `projections.apiserver`'s, for kubectl. A list or an object asked
as a `Table` (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`, as kubectl asks) is
answered as one (`projections.apiserver.tables`). A list path with `?watch=true` streams
the changes (`projections.apiserver.watch`); `resourceVersion` on a get or list reads the
state at that sequence of the log (`projections.apiserver.versions`).

Read-only, GET only; a miss is a Kubernetes `Status` object with code 404. A list asked with
`limit` comes a page at a time, as kube-apiserver pages one: at most `limit` items, and
`metadata.continue` (with `remainingItemCount`) while items remain; every page is cut from
the first page's state (`projections.paging`), and a list no longer kept is rebuilt from the
log at that state (an audit read: 429 `TooManyRequests` past the asker's bucket). A `limit`
that is no integer, or a `continue` token this service did not give, is 400 `BadRequest`.
aiohttp serves it (the maintained asyncio HTTP server); `respond` answers every path but a
list's pages (`list_page`), a pure function.

Who asks is who a bearer token names, from a static token file in Kubernetes' own format
(kube-apiserver's `--token-auth-file`); no token is `system:anonymous`, a token the file
does not hold is 401. Behind kube-rbac-proxy (`--auth-header-fields-enabled`), which checks
the caller's Kubernetes token and drops it, who asks is the user the proxy names in
`X-Remote-User`, when the API is told to trust it (`trust_proxy_headers`) and the request
comes from a loopback address (the proxy is a sidecar in the same pod); from anywhere else
the header is ignored, and logged. Every answer is what the policy shows that user;
`/metrics` needs a `get` of that path (a `nonResourceURLs` rule: `cluster-admin`,
`system:monitoring`).
"""

from __future__ import annotations

import csv
import hashlib
import ipaddress
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

import msgspec
import structlog
from aiohttp import web
from nats.errors import Error as NatsError

from events.api.errors import InvalidSpec
from events.api.kinds import kind_named, of_resource
from events.api.names import NODE_ACTOR_PREFIX
from events.authorization.policy import PathRequest, Policy
from events.language.query import Query
from projections.apiserver import discovery, openapi, tables, versions, watch
from projections.cluster import ClusterState
from projections.hco import METRICS_QUERY
from projections.paging import Listed, ListPages, parse_continue

log = structlog.get_logger(__name__)

Render = Callable[[ClusterState, Query], list[dict[str, Any]]]
ProcessMetrics = Callable[[], bytes]
"""The serving process's own counters (Prometheus text): not functions of the log, so kept
out of the log's metrics and appended only to what `/metrics` scrapes."""
ANONYMOUS: Final = "system:anonymous"
"""Who asks without a token: what Kubernetes calls an unauthenticated request."""
METRICS_PATH: Final = "/metrics"
UNAUTHORIZED: Final = "unauthorized"
"""A `refuse` reason: a bearer token the token file does not hold (or no bearer token)."""
BAD_PARAMETER: Final = "bad_parameter"
"""A `refuse` reason: a list's `limit` or `continue` that is not one (400)."""
FORBIDDEN_WATCH: Final = "forbidden"
"""A `refuse` reason: a watch of a namespace the policy does not let the user watch (403),
counted with the read service's other refusals by the policy."""
FORBIDDEN_PATH: Final = "forbidden_path"
"""A `refuse` reason: a path the policy does not let the user get (`/metrics`)."""
NODE_IDENTITY: Final = "node_identity"
"""A `refuse` reason: a node agent's name (`system:node:<node>`) over HTTP, where a token file
or a proxy names users: a node's sight (its own VMIs, whatever the policy) is its agent's,
which asks over NATS as the server vouches (behind kube-rbac-proxy a kubelet is named so)."""
REMOTE_USER_HEADER: Final = "X-Remote-User"
"""Where kube-rbac-proxy names the user it authenticated (its `--auth-header-user-field-name`
default); it sets the header itself, over any the caller sent. Its groups header is not
read: the policy binds users."""


class Reader(watch.Source, Protocol):
    """What the HTTP API serves from (`projections.service.ReadService`)."""

    policy: Policy

    def render(self, state: ClusterState, query: Query, asker: str) -> list[dict[str, Any]]:
        """What `query` names, as `asker` may see it."""

    def process_metrics(self) -> bytes: ...

    async def listed_at(self, sequence: int, query: Query, asker: str) -> Listed:
        """The list `query` names as `asker` saw it at `sequence`, rebuilt from the log;
        `TooManyRequests` past the asker's audit reads."""

    def refuse(self, reason: str, **detail: str) -> None:
        """Count and log a refusal."""


class TooManyRequests(Exception):
    """An audit read past the asker's bucket: 429, to be asked again in `retry_after_seconds`."""

    def __init__(self, retry_after_seconds: int) -> None:
        self.retry_after_seconds = retry_after_seconds
        super().__init__("Too many requests, please try again later.")


class StaticTokens:
    """Bearer tokens and the users they stand for, from Kubernetes' static token file: CSV
    lines `token,user,uid[,"group1,group2"]` (the policy binds users, so uid and groups are
    read past). Tokens are kept as digests, and looked up by digest."""

    def __init__(self, users: dict[bytes, str]) -> None:
        self.users = users

    @classmethod
    def load(cls, path: str | Path) -> StaticTokens:
        """The file's tokens; an unreadable or malformed file is `InvalidSpec` naming the
        line (never the token)."""
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise InvalidSpec(str(path), f"cannot read the token file: {e.strerror or e}"
                              ) from None
        users: dict[bytes, str] = {}
        for number, row in enumerate(csv.reader(text.splitlines()), start=1):
            if not row or not "".join(row).strip():
                continue
            if len(row) < 3 or not row[0] or not row[1]:
                raise InvalidSpec(f"{path}:{number}", "must be token,user,uid[,\"groups\"]")
            digest = _digest(row[0])
            if digest in users:
                raise InvalidSpec(f"{path}:{number}", "a token given twice")
            users[digest] = row[1]
        return cls(users)

    def user(self, authorization: str | None) -> str | None:
        """Who an `Authorization` header names: `ANONYMOUS` for none, None for a token this
        file does not hold (or anything but a bearer token)."""
        if authorization is None:
            return ANONYMOUS
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.users.get(_digest(token.strip()))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
LIMIT: Final = re.compile(r"(-?[0-9]{1,18})?")
"""A list's `limit`: an integer (Go's ParseInt, as kube-apiserver reads it); 0 or below,
or none, is no limit."""
HTTP_LISTS_KEPT: Final = 8
HTTP_LISTS_KEPT_EACH: Final = 2
"""Lists kept for their further pages: kubectl and client-go page every list (500 items),
so a few askers page at once; one asker keeps at most two of them."""


def route(path: str) -> tuple[Query, bool] | None:
    """The query a path asks and whether it names one object; None if no such path. Every
    declared kind is served at kube-apiserver's paths for its group, version and scope:
    `/api/v1/...` for the core group, `/apis/<group>/<version>/...` for the others."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    match parts:
        case ["api", version, *rest]:
            group = ""
        case ["apis", group, version, *rest]:
            pass
        case _:
            return None
    match rest:
        case ["namespaces", namespace, plural, *name] if len(name) < 2:
            kind = of_resource(group, plural)
            if kind is None or not kind.namespaced:
                return None
        case [plural, *name] if len(name) < 2:
            namespace, kind = "", of_resource(group, plural)
            if kind is not None and kind.namespaced and name:
                return None
        case _:
            return None
    if kind is None or version not in kind.versions:
        return None
    return Query(kind=kind.kind, namespace=namespace, name="".join(name)), bool(name)


def respond(state: ClusterState, render: Render, path: str,
            process_metrics: ProcessMetrics = bytes) -> tuple[int, str, bytes]:
    """(status, content type, body) for a GET of `path`."""
    if path in ("/healthz", "/readyz", "/livez"):
        return 200, "text/plain", b"ok"
    if path == "/version":
        return 200, "application/json", json.dumps(versions.server_version()).encode()
    if path == "/metrics":
        [item] = render(state, Query(kind=METRICS_QUERY))
        return 200, "text/plain; version=0.0.4", str(item["text"]).encode() + process_metrics()
    routed = route(path)
    if routed is None:
        return _status(404, "NotFound", f"the server could not find the requested resource {path}")
    query, single = routed
    items = render(state, query)
    if single:
        if not items:
            return _status(404, "NotFound", f'{query.kind.lower()} "{query.name}" not found')
        return 200, "application/json", json.dumps(items[0]).encode()
    return _list(query, items, {"resourceVersion": str(state.last_sequence)})


async def list_page(state: ClusterState, reader: Reader, pages: ListPages, asker: str,
                    query: Query, *, limit_param: str,
                    continue_param: str) -> tuple[int, str, bytes]:
    """(status, content type, body) for one page of the list `query` names (see the
    module): the first cut from the state now, a further one from the list it continues;
    `TooManyRequests` when that list must be rebuilt and the asker has no audit read left."""
    def bad(message: str) -> tuple[int, str, bytes]:
        reader.refuse(BAD_PARAMETER, user=asker, kind=query.kind, error=message)
        return _status(400, "BadRequest", message)

    if not LIMIT.fullmatch(limit_param):
        return bad(f"limit: must be an integer, not {limit_param[:40]!r}")
    limit = int(limit_param or "0")
    try:
        continued = parse_continue(continue_param)
    except ValueError as e:
        return bad(str(e))
    if continued is not None and continued.sequence > state.last_sequence:
        return bad(f"continue: not a token this service gave, {continue_param[:40]!r} "
                   "(a state it has not reached)")
    key = (asker, query.kind, query.namespace)
    sequence, offset = continued or (state.last_sequence, 0)
    listed = pages.get(key, sequence)
    if listed is None and sequence == state.last_sequence:  # the state now: no rebuild
        listed = Listed.of(reader.render(state, query, asker))
    if listed is None:
        try:
            listed = await reader.listed_at(sequence, query, asker)
        except (TimeoutError, NatsError) as e:
            log.warning("a list page not rebuilt", user=asker, kind=query.kind,
                        sequence=sequence, error=f"{type(e).__name__}: {e}")
            return _status(503, "ServiceUnavailable",
                           f"the log could not be read at {sequence}: {type(e).__name__}")
    items, token = pages.page(key, sequence, listed, offset, limit=max(limit, 0))
    metadata: dict[str, Any] = {"resourceVersion": str(sequence)}
    if token:
        metadata |= {"continue": token,
                     "remainingItemCount": len(listed.items) - offset - len(items)}
    return _list(query, [msgspec.msgpack.decode(item) for item in items], metadata)


def _list(query: Query, items: list[dict[str, Any]],
          metadata: dict[str, Any]) -> tuple[int, str, bytes]:
    body = {"apiVersion": "v1", "kind": f"{query.kind}List", "items": items,
            "metadata": metadata}
    return 200, "application/json", json.dumps(body).encode()


_status = versions.status


def _loopback(peer: str | None) -> bool:
    try:
        return peer is not None and ipaddress.ip_address(peer).is_loopback
    except ValueError:  # no IP address (a Unix socket)
        return False


def asker(request: web.Request, tokens: StaticTokens, trust_proxy_headers: bool) -> str | None:
    """Who asks: the user a trusted proxy names (see the module), else who the bearer token
    names (`StaticTokens.user`)."""
    proxied = request.headers.get(REMOTE_USER_HEADER, "").strip()
    if proxied:
        if trust_proxy_headers and _loopback(request.remote):
            return proxied
        log.warning("ignored an identity header from an untrusted peer",
                    header=REMOTE_USER_HEADER, peer=request.remote, path=request.path,
                    trusted=trust_proxy_headers)
    return tokens.user(request.headers.get("Authorization"))


def _for_kubectl(request: web.Request,
                 answered: tuple[int, str, bytes]) -> tuple[int, str, bytes]:
    """What kubectl asks beside the objects (`projections.apiserver`): discovery or OpenAPI at
    their paths (else `answered`, a 404), a list or an object as a `Table` where the request
    asks one first."""
    accept = request.headers.get("Accept", "")
    routed = route(request.path)
    if routed is None:
        return discovery.answer(request.path, accept) or openapi.answer(request.path) or answered
    kind = kind_named(routed[0].kind)
    return answered if kind is None else tables.negotiated(
        kind, answered, accept, request.query.get("includeObject", ""))


class _Answers:
    """The handlers of one HTTP API: who asks (`who`), a watch (`watched`), any other GET
    (`answer`), each as its asker may see it."""

    def __init__(self, state: ClusterState, reader: Reader, tokens: StaticTokens,
                 trust_proxy_headers: bool) -> None:
        self.state, self.reader, self.tokens = state, reader, tokens
        self.trust_proxy_headers = trust_proxy_headers
        self.pages = ListPages(HTTP_LISTS_KEPT, HTTP_LISTS_KEPT_EACH)

    async def get(self, request: web.Request) -> web.StreamResponse:
        try:
            routed = route(request.path)
            if routed is not None and not routed[1] and watch.wanted(request.query):
                return await self.watched(request, routed[0])
            code, ctype, body = await self.answer(request)
        except TooManyRequests as e:
            code, ctype, body = _status(429, "TooManyRequests", str(e),
                                        {"retryAfterSeconds": e.retry_after_seconds})
            return web.Response(status=code, body=body, headers={
                "Content-Type": ctype, "Retry-After": str(e.retry_after_seconds)})
        return web.Response(status=code, body=body, headers={"Content-Type": ctype})

    def who(self, request: web.Request) -> str | tuple[int, str, bytes]:
        """The asker's name, or the refusal to answer them."""
        user = asker(request, self.tokens, self.trust_proxy_headers)
        if user is None:
            self.reader.refuse(UNAUTHORIZED, path=request.path)
            return _status(401, "Unauthorized", "Unauthorized")
        if user.startswith(NODE_ACTOR_PREFIX):
            self.reader.refuse(NODE_IDENTITY, path=request.path, user=user)
            return _status(403, "Forbidden", f"forbidden: User {user!r}: a node agent's "
                                             "identity reads over NATS only")
        return user

    async def watched(self, request: web.Request, query: Query) -> web.StreamResponse:
        user, kind = self.who(request), kind_named(query.kind)
        if isinstance(user, tuple) or kind is None:
            code, ctype, body = user if isinstance(user, tuple) else _status(404, "NotFound", "")
            return web.Response(status=code, body=body, headers={"Content-Type": ctype})
        streamed = await watch.serve(request, self.reader, self.state, kind=kind, query=query,
                                     asker=user)
        if isinstance(streamed, web.StreamResponse):
            return streamed
        code, message = streamed
        self.reader.refuse(BAD_PARAMETER if code == 400 else FORBIDDEN_WATCH,
                           path=request.path, user=user, error=message)
        code, ctype, body = _status(code, "BadRequest" if code == 400 else "Forbidden", message)
        return web.Response(status=code, body=body, headers={"Content-Type": ctype})

    async def answer(self, request: web.Request) -> tuple[int, str, bytes]:
        user = self.who(request)
        if isinstance(user, tuple):
            return user
        reader, state = self.reader, self.state
        if request.path == METRICS_PATH and not reader.policy.allows(
                user, access := PathRequest("get", METRICS_PATH)):
            reader.refuse(FORBIDDEN_PATH, path=request.path, user=user)
            return _status(403, "Forbidden", f"forbidden: User {user!r} {access}")
        routed = route(request.path)
        if routed is not None:
            async def page(continued: str, limit: str) -> tuple[int, str, bytes]:
                return await list_page(state, reader, self.pages, user, routed[0],
                                       limit_param=limit, continue_param=continued)
            at = await versions.answer(state, reader, user, routed[0], single=routed[1],
                                       params=request.query, list_page=page)
            if at is not None:
                return _for_kubectl(request, at)
            if not routed[1] and ("limit" in request.query or "continue" in request.query):
                return _for_kubectl(request, await page(request.query.get("continue", ""),
                                                        request.query.get("limit", "")))
        return _for_kubectl(request, respond(state, lambda s, q: reader.render(s, q, user),
                                             request.path, reader.process_metrics))


async def _read_only(_request: web.Request) -> web.Response:
    code, ctype, body = _status(405, "MethodNotAllowed", "the read API is read-only")
    return web.Response(status=code, body=body, headers={"Content-Type": ctype})


async def serve(state: ClusterState, reader: Reader, host: str, port: int,
                tokens: StaticTokens | None = None, *,
                trust_proxy_headers: bool = False) -> web.AppRunner:
    """Serve until the returned runner is cleaned up (`await runner.cleanup()`). aiohttp does
    the HTTP; every path is answered by `respond` as its asker (`asker`) sees it (without a
    token file, any token is unknown), any method but GET is 405."""
    answers = _Answers(state, reader, tokens or StaticTokens({}), trust_proxy_headers)
    app = web.Application()
    app.router.add_get("/{path:.*}", answers.get, allow_head=False)
    app.router.add_route("*", "/{path:.*}", _read_only)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("http read API listening", host=host, port=port)
    return runner
