"""What the agent asks the cluster's read service (`<p>.query.get`, `events.language.query`):
the VMIs placed on its node, and the KubeVirt configuration, each as of the log's end."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
from nats.aio.client import Client

from events.api.errors import VirtbusError
from events.jetstream.transient import describe, is_transient
from events.language.messages import node_actor
from events.language.query import Answer, Query, ask
from events.language.subjects import Layout
from nodeagent.defaults import READ_SERVICE_RETRY_SECONDS
from nodeagent.phases import FINISHED
from nodeagent.vmiref import VMIRef

VMI_KIND = "VirtualMachineInstance"

Placed = dict[str, tuple[VMIRef, str, dict[str, Any]]]
"""Active VMIs placed on a node, by uid: which, their phase, the VMI."""


class ReadServiceUnavailable(VirtbusError):
    """The read service did not answer (yet)."""


class ReadService:
    """The read service as one node's agent asks it (as the node's own actor)."""

    def __init__(self, nc: Client, layout: Layout, node: str, wait_seconds: float) -> None:
        self.nc, self.layout, self.node = nc, layout, node
        self.wait_seconds = wait_seconds
        """How long `placed` waits for a read service to answer."""

    async def placed(self) -> Placed:
        """Active VMIs placed on this node, as of the log's end when we asked."""
        deadline = time.monotonic() + self.wait_seconds
        while True:
            try:
                answer = await self.query(Query(kind=VMI_KIND, node=self.node))
                break
            except ReadServiceUnavailable:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(READ_SERVICE_RETRY_SECONDS)  # retry backoff
        out: Placed = {}
        for item in answer.items:
            meta, status = item["metadata"], item.get("status", {})
            phase = status.get("phase", "")
            if status.get("nodeName") == self.node and phase not in FINISHED:
                ref = VMIRef(meta["namespace"], meta["name"], meta["uid"])
                out[meta["uid"]] = (ref, phase, item)
        return out

    async def query(self, query: Query) -> Answer:
        """Ask, as of the log's end now."""
        try:
            info = await self.nc.jetstream().stream_info(self.layout.events_stream)
            answer = await ask(self.nc, self.layout,
                               msgspec.structs.replace(query, after=info.state.last_seq),
                               node_actor(self.node))
        except Exception as e:  # no read service (yet), or NATS failing for a moment
            if not is_transient(e):
                raise
            raise ReadServiceUnavailable(describe(e)) from e
        if answer.error:
            raise ReadServiceUnavailable(answer.error)
        return answer
