"""The HTTP read API: the read model at kube-apiserver-shaped paths, plus `/metrics`.

| path                                                             | answer              |
|------------------------------------------------------------------|---------------------|
| `/apis/kubevirt.io/v1/virtualmachines`                           | VirtualMachineList  |
| `/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines[/{name}]`  | list or one object  |
| the same for `virtualmachineinstances`,                          |                     |
| `virtualmachineinstancereplicasets` and                          |                     |
| `virtualmachineinstancepresets`                                  |                     |
| `/api/v1/nodes[/{name}]`                                         | NodeList or a Node  |
| `/apis/instancetype.kubevirt.io/{version}/[namespaces/{ns}/]`    | list or one object  |
| `virtualmachine[cluster]{instancetypes,preferences}[/{name}]`    |                     |
| `/metrics`                                                       | Prometheus text     |
| `/healthz`                                                       | `ok`                |

Read-only, GET only; a miss is a Kubernetes `Status` object with code 404. aiohttp serves
it (the maintained asyncio HTTP server); `respond` is the whole API, a pure function.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web

from events.api.instancetype import (
    API_VERSIONS,
    CLUSTER_INSTANCETYPE,
    CLUSTER_PREFERENCE,
    INSTANCETYPE,
    PREFERENCE,
)
from events.api.replicaset import PRESET, REPLICA_SET
from events.query import Query
from projections.cluster import ClusterState
from projections.hco import METRICS_QUERY

log = structlog.get_logger(__name__)

Render = Callable[[ClusterState, Query], list[dict[str, Any]]]
ProcessMetrics = Callable[[], bytes]
"""The serving process's own counters (Prometheus text): not functions of the log, so kept
out of the log's metrics and appended only to what `/metrics` scrapes."""
RESOURCES = {"virtualmachines": "VirtualMachine",
             "virtualmachineinstances": "VirtualMachineInstance", "nodes": "Node",
             "virtualmachineinstancereplicasets": REPLICA_SET,
             "virtualmachineinstancepresets": PRESET}
INSTANCETYPE_RESOURCES = {"virtualmachineinstancetypes": INSTANCETYPE,
                          "virtualmachinepreferences": PREFERENCE}
CLUSTER_INSTANCETYPE_RESOURCES = {"virtualmachineclusterinstancetypes": CLUSTER_INSTANCETYPE,
                                  "virtualmachineclusterpreferences": CLUSTER_PREFERENCE}
INSTANCETYPE_VERSIONS = [v.rpartition("/")[2] for v in API_VERSIONS]


def route(path: str) -> tuple[Query, bool] | None:
    """The query a path asks and whether it names one object; None if no such path."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    match parts:
        case ["apis", "kubevirt.io", "v1", resource] if resource in RESOURCES:
            return Query(kind=RESOURCES[resource]), False
        case ["apis", "kubevirt.io", "v1", "namespaces", ns, resource] if resource in RESOURCES:
            return Query(kind=RESOURCES[resource], namespace=ns), False
        case ["apis", "kubevirt.io", "v1", "namespaces", ns, resource, name] \
                if resource in RESOURCES:
            return Query(kind=RESOURCES[resource], namespace=ns, name=name), True
        case ["api", "v1", "nodes"]:
            return Query(kind="Node"), False
        case ["api", "v1", "nodes", name]:
            return Query(kind="Node", name=name), True
        case ["apis", "instancetype.kubevirt.io", version, *rest] \
                if version in INSTANCETYPE_VERSIONS:
            return _instancetype_route(rest)
        case _:
            return None


def _instancetype_route(parts: list[str]) -> tuple[Query, bool] | None:
    match parts:
        case [resource, *name] if resource in CLUSTER_INSTANCETYPE_RESOURCES and len(name) < 2:
            return Query(kind=CLUSTER_INSTANCETYPE_RESOURCES[resource],
                         name="".join(name)), bool(name)
        case [resource] if resource in INSTANCETYPE_RESOURCES:
            return Query(kind=INSTANCETYPE_RESOURCES[resource]), False
        case ["namespaces", ns, resource, *name] if resource in INSTANCETYPE_RESOURCES \
                and len(name) < 2:
            return Query(kind=INSTANCETYPE_RESOURCES[resource], namespace=ns,
                         name="".join(name)), bool(name)
    return None


def respond(state: ClusterState, render: Render, path: str,
            process_metrics: ProcessMetrics = bytes) -> tuple[int, str, bytes]:
    """(status, content type, body) for a GET of `path`."""
    if path == "/healthz":
        return 200, "text/plain", b"ok"
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
    body = {"apiVersion": "v1", "kind": f"{query.kind}List", "items": items,
            "metadata": {"resourceVersion": str(state.last_sequence)}}
    return 200, "application/json", json.dumps(body).encode()


def _status(code: int, reason: str, message: str) -> tuple[int, str, bytes]:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}
    return code, "application/json", json.dumps(body).encode()


async def serve(state: ClusterState, render: Render, host: str, port: int,
                process_metrics: ProcessMetrics = bytes) -> web.AppRunner:
    """Serve until the returned runner is cleaned up (`await runner.cleanup()`). aiohttp does
    the HTTP; every path is answered by `respond`, any method but GET is 405."""

    async def get(request: web.Request) -> web.Response:
        code, ctype, body = respond(state, render, request.path, process_metrics)
        return web.Response(status=code, body=body, headers={"Content-Type": ctype})

    async def refuse(_request: web.Request) -> web.Response:
        code, ctype, body = _status(405, "MethodNotAllowed", "the read API is read-only")
        return web.Response(status=code, body=body, headers={"Content-Type": ctype})

    app = web.Application()
    app.router.add_get("/{path:.*}", get, allow_head=False)
    app.router.add_route("*", "/{path:.*}", refuse)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("http read API listening", host=host, port=port)
    return runner
