"""The node's heartbeat: its time in the heartbeats KV bucket every `HEARTBEAT_INTERVAL`.

Heartbeats are not events: the control plane reads them, and a node silent for its grace
becomes NotReady (an event it appends). A silenced agent (a simulated agent stop) beats not.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.kv import KeyValue

from events.jetstream.streams import HEARTBEAT_INTERVAL
from events.jetstream.transient import describe, is_transient, note
from events.language.subjects import Layout, encode_token
from events.runtime.aio import pause_unless_stopped

log = structlog.get_logger(__name__)


async def beat(nc: Client, layout: Layout, node: str, *, active: asyncio.Event,
               stop: asyncio.Event) -> None:
    """Beat until `stop`; a beat NATS cannot take (or a bucket it cannot bind yet) is one
    log line, and the next beat is the retry."""
    js = nc.jetstream()
    kv: KeyValue | None = None
    key = encode_token(node)
    failures = 0
    while not stop.is_set():
        if active.is_set():
            try:
                kv = kv or await js.key_value(layout.heartbeats_bucket)
                await kv.put(key, str(time.time()).encode())
                failures = 0
            except (TimeoutError, NatsError) as e:
                failures += 1
                if is_transient(e):
                    note("heartbeat", e, failures)
                else:
                    log.warning("heartbeat not written", node=node, error=describe(e))
        await pause_unless_stopped(stop, HEARTBEAT_INTERVAL)
