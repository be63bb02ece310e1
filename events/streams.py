"""Creates (idempotently) the streams and KV buckets of one installation, as the design lays
them out. Every timing here is a named default."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Final

from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.client import JetStreamContext
from nats.js.errors import BadRequestError, NotFoundError

from events.subjects import Layout

EVENT_DEDUPE_WINDOW: Final = 10 * 60.0
COMMAND_RETENTION: Final = 7 * 24 * 3600.0
DEAD_LETTER_RETENTION: Final = 30 * 24 * 3600.0
NODE_DEDUPE_WINDOW: Final = 60 * 60.0
HEARTBEAT_TTL: Final = 60.0
"""Heartbeat entries outlive any grace period; staleness is judged by the control plane."""
HEARTBEAT_INTERVAL: Final = 2.0
LEASE_TTL: Final = 10.0


def events_stream_config(layout: Layout, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=layout.events_stream,
        subjects=[layout.events_filter(), f"{layout.tracking_root}.>", layout.guard_subject],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        deny_delete=True,
        deny_purge=True,
        allow_direct=True,
        allow_atomic=True,
        duplicate_window=EVENT_DEDUPE_WINDOW,
        num_replicas=replicas,
    )


def snapshots_stream_config(layout: Layout) -> StreamConfig:
    """Aggregate snapshots (the library's `snapshots` recorder), kept apart from the log."""
    return StreamConfig(
        name=layout.snapshots_stream,
        subjects=[f"{layout.snapshots_root}.>"],
        storage=StorageType.FILE,
        allow_direct=True,
        allow_atomic=True,
    )


def _stream_configs(layout: Layout, replicas: int) -> list[StreamConfig]:
    return [
        events_stream_config(layout, replicas),
        StreamConfig(
            name=layout.commands_stream,
            subjects=[layout.commands_filter],
            retention=RetentionPolicy.LIMITS,
            max_age=COMMAND_RETENTION,
            allow_direct=True,
            num_replicas=replicas,
        ),
        StreamConfig(
            name=layout.node_stream,
            subjects=[f"{layout.prefix}.node.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            duplicate_window=NODE_DEDUPE_WINDOW,
            num_replicas=replicas,
        ),
        StreamConfig(
            name=layout.dead_letter_stream,
            subjects=[f"{layout.prefix}.dead.>"],
            retention=RetentionPolicy.LIMITS,
            max_age=DEAD_LETTER_RETENTION,
            allow_direct=True,
            num_replicas=replicas,
        ),
        StreamConfig(
            name=layout.reports_stream,
            subjects=[layout.reports_filter],
            retention=RetentionPolicy.WORK_QUEUE,
            discard=DiscardPolicy.OLD,
            num_replicas=replicas,
        ),
    ]


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    assert config.name is not None
    try:
        await js.add_stream(config)
    except BadRequestError:
        await js.update_stream(config)


async def create_stream_if_missing(js: JetStreamContext, config: StreamConfig) -> None:
    """Create the stream unless it exists; an existing one keeps its configuration.

    For processes that only use the store: `ensure_all` owns the installation's settings
    (replicas above all), and `ensure_stream` from a process that does not know them would
    scale an R3 stream down to `config`'s replicas.
    """
    assert config.name is not None
    try:
        await js.stream_info(config.name)
    except NotFoundError:
        await ensure_stream(js, config)


async def ensure_all(js: JetStreamContext, layout: Layout, replicas: int = 1) -> None:
    """Every stream and bucket of the installation; safe to call from every process."""
    for config in _stream_configs(layout, replicas):
        await ensure_stream(js, config)
    buckets = [
        KeyValueConfig(bucket=layout.heartbeats_bucket, ttl=HEARTBEAT_TTL, replicas=replicas),
        KeyValueConfig(bucket=layout.leases_bucket, ttl=LEASE_TTL, replicas=replicas),
        KeyValueConfig(bucket=layout.checkpoints_bucket, replicas=replicas),
        KeyValueConfig(bucket=layout.outcomes_bucket, ttl=COMMAND_RETENTION,
                       replicas=replicas),
        KeyValueConfig(bucket=layout.applied_bucket, replicas=replicas),
    ]
    for bucket in buckets:
        await ensure_bucket(js, bucket)


async def ensure_bucket(js: JetStreamContext, config: KeyValueConfig) -> None:
    """Create the bucket, or bring an existing one to `config`'s replicas and TTL (an
    installation made with fewer replicas). nats-py cannot update a bucket; a bucket is the
    stream `KV_<bucket>`, updated as such."""
    try:
        await js.create_key_value(config)
    except BadRequestError:
        info = await js.stream_info(f"KV_{config.bucket}")
        await js.update_stream(dataclasses.replace(
            info.config, num_replicas=config.replicas, max_age=config.ttl))


async def wait_for_streams(js: JetStreamContext, layout: Layout, timeout: float = 30.0) -> None:
    """Readers and agents do not create the installation; they wait for the control plane to."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await js.stream_info(layout.events_stream)
            await js.stream_info(layout.reports_stream)
            return
        except NotFoundError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)  # polling for another process's set-up
