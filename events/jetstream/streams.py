"""Creates (idempotently) the streams and KV buckets of one installation, as the design lays
them out. Every timing here is a named default."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Final

from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
)
from nats.js.client import JetStreamContext
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from events.jetstream.connect import Access, connect
from events.jetstream.transient import is_transient, retry_within
from events.language.subjects import Layout, encode_token
from events.runtime.aio import ACK_WAIT_SECONDS

EVENT_DEDUPE_WINDOW: Final = 10 * 60.0
COMMAND_RETENTION: Final = 7 * 24 * 3600.0
DEAD_LETTER_RETENTION: Final = 30 * 24 * 3600.0
NODE_DEDUPE_WINDOW: Final = 60 * 60.0
READ_SNAPSHOTS_MAX_MESSAGES: Final = 4096
"""Messages (128 KiB object chunks, and each object's meta) the read-model snapshots may take
before the oldest go: at most some 512 MiB. A count, not `max_bytes`, which the server would
reserve in full for every installation at once."""
CONSOLE_RETENTION: Final = 7 * 24 * 3600.0
CONSOLE_CHUNK_BYTES: Final = 8 * 1024
"""The most console output one message holds (`nodeagent.console` cuts it so)."""
CONSOLE_CHUNKS_PER_GUEST: Final = 512
"""Console messages kept per VMI instance (its subject): the last 4 MiB at most, as a
rotating serial console log would keep."""
HEARTBEAT_TTL: Final = 60.0
"""Heartbeat entries outlive any grace period; staleness is judged by the control plane."""
HEARTBEAT_INTERVAL: Final = 2.0
LEASE_TTL: Final = 10.0
STREAMS_WAIT_SECONDS: Final = 30.0
"""How long a reader or an agent waits for the installation's streams at start."""
STREAMS_POLL_SECONDS: Final = 0.1
"""How often it looks again while they are not there yet."""
WORK_MAX_DELIVER: Final = 5
"""Deliveries of one node work item before JetStream gives up on it (and says so in a
MAX_DELIVERIES advisory): enough for an agent killed and restarted a few times mid-work, few
enough that an item which kills its agent every time stops after that many restarts."""
ENSURE_WITHIN_SECONDS: Final = 60.0
"""How long one set-up call retries a cluster that cannot answer yet (electing leaders after
losing a server), before the set-up fails with the last error."""


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


def read_snapshots_stream_config(layout: Layout, replicas: int = 1) -> StreamConfig:
    """The object store of read-model snapshots, as nats-py would make it, but a ring: at
    `READ_SNAPSHOTS_MAX_MESSAGES` the oldest chunks go (an object that lost some is corrupt and
    ignored by its readers), so nobody needs the purge every stream denies."""
    bucket = layout.read_snapshots_bucket
    return StreamConfig(
        name=layout.read_snapshots_stream,
        subjects=[f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"],
        storage=StorageType.FILE,
        max_msgs=READ_SNAPSHOTS_MAX_MESSAGES,
        discard=DiscardPolicy.OLD,
        allow_rollup_hdrs=True,
        allow_direct=True,
        num_replicas=replicas,
    )


def _stream_configs(layout: Layout, replicas: int) -> list[StreamConfig]:
    return [
        events_stream_config(layout, replicas),
        read_snapshots_stream_config(layout, replicas),
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
            subjects=[layout.node_work],
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
            name=layout.console_stream,
            subjects=[f"{layout.prefix}.console.>"],
            retention=RetentionPolicy.LIMITS,
            max_age=CONSOLE_RETENTION,
            max_msgs_per_subject=CONSOLE_CHUNKS_PER_GUEST,
            discard=DiscardPolicy.OLD,
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


def work_consumer(node: str) -> str:
    """The durable pull consumer through which `node`'s agent takes its work."""
    return f"agent-{encode_token(node)}"


def work_consumer_config(layout: Layout, node: str) -> ConsumerConfig:
    """`node`'s work consumer: pull (no deliver subject), its node's subjects only. The
    control plane creates it and sets it up again when it is gone; the agent only binds and
    pulls, since a create request's body, which no permission sees, could make it a push
    consumer publishing the node's work wherever its creator said."""
    name = work_consumer(node)
    # One item out at a time: the agent works them one by one, and one it left unfinished
    # (it died, NATS failed it) must come again before any later one (a pause, then its
    # unpause, would otherwise end paused).
    return ConsumerConfig(name=name, durable_name=name, filter_subject=layout.node_filter(node),
                          ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_SECONDS,
                          max_deliver=WORK_MAX_DELIVER, max_ack_pending=1)


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """Create the stream, or bring an existing one to `config` where the two differ. Its
    replicas are never lowered (an installation raised to R3 stays R3, whoever calls this
    with fewer), and a stream that already matches is left alone: an R3 stream that has
    lost a server answers `stream_info` but may not take an update."""
    assert config.name is not None
    name = config.name
    info = await _ensure_info(js, name)
    if info is None:
        try:
            await retry_within(lambda: js.add_stream(config), "creating stream",
                               ENSURE_WITHIN_SECONDS, stream=name)
            return
        except BadRequestError:  # made meanwhile, by another process
            info = await _ensure_info(js, name)
            if info is None:
                raise
    wanted = dataclasses.replace(config, num_replicas=max(config.num_replicas or 1,
                                                          info.config.num_replicas or 1))
    if _ensure_differs(wanted, info.config):
        await retry_within(lambda: js.update_stream(wanted), "updating stream",
                           ENSURE_WITHIN_SECONDS, stream=name)


async def _ensure_info(js: JetStreamContext, name: str) -> StreamInfo | None:
    """The stream's info, or None if it does not exist; transient failures retried."""

    async def look() -> StreamInfo | None:
        try:
            return await js.stream_info(name)
        except NotFoundError:
            return None

    return await retry_within(look, "reading stream", ENSURE_WITHIN_SECONDS, stream=name)


def _ensure_differs(wanted: StreamConfig, existing: StreamConfig) -> bool:
    """Whether `existing` differs from what `wanted` sets (a field left at its default is
    not set: the server fills it in)."""
    for field in dataclasses.fields(StreamConfig):
        value = getattr(wanted, field.name)
        if value is None or value == field.default or field.name == "metadata":
            continue
        have = getattr(existing, field.name)
        if isinstance(value, list):
            value, have = sorted(value), sorted(have or [])
        if value != have:
            return True
    return False


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
        bucket.direct = reads_direct(layout, bucket.bucket)
        await ensure_bucket(js, bucket)


def reads_direct(layout: Layout, bucket: str) -> bool:
    """Whether a bucket is read by Direct Get. Those read per key by users whose NATS
    permissions name their own keys (outcomes, the node work log, a node's own heartbeat)
    must be: Direct Get names the key in its subject, the stored-message get nats-py uses
    otherwise names it in the body, where no permission sees it. The lease and the
    checkpoints are not: on a cluster any replica answers a Direct Get, a lagging one too,
    and the lease's compare-and-set and the dispatcher's restart position want the
    stream leader's answer."""
    return bucket not in (layout.leases_bucket, layout.checkpoints_bucket)


async def ensure_bucket(js: JetStreamContext, config: KeyValueConfig) -> None:
    """Create the bucket, or bring an existing one to `config`'s replicas (never lowered),
    TTL and Direct Get (an installation made before); one that matches is left alone.
    nats-py cannot update a bucket; a bucket is the stream `KV_<bucket>`, updated as such.

    Direct Get names the key in the request's subject (`$JS.API.DIRECT.GET.KV_<b>.$KV.<b>.
    <key>`), so a NATS permission can give a user its own keys only; the stored-message get
    nats-py uses otherwise names the key in the body, where no permission sees it."""
    name = f"KV_{config.bucket}"
    info = await _ensure_info(js, name)
    if info is None:
        try:
            await retry_within(lambda: js.create_key_value(config), "creating bucket",
                               ENSURE_WITHIN_SECONDS, bucket=config.bucket)
            return
        except BadRequestError:  # made meanwhile, by another process
            info = await _ensure_info(js, name)
            if info is None:
                raise
    replicas = max(config.replicas, info.config.num_replicas or 1)  # never lowered
    if info.config.num_replicas == replicas and (info.config.max_age or 0.0) == (
            config.ttl or 0.0) and bool(info.config.allow_direct) == config.direct:
        return
    wanted = dataclasses.replace(info.config, num_replicas=replicas, max_age=config.ttl,
                                 allow_direct=config.direct)
    await retry_within(lambda: js.update_stream(wanted), "updating bucket",
                       ENSURE_WITHIN_SECONDS, bucket=config.bucket)


async def get_key(kv: KeyValue, key: str) -> KeyValue.Entry | None:
    """The key's entry, None if it is absent or deleted. nats-py reads every 404 as "key not
    found", a stream not found too, which a cluster answers while it elects the bucket's
    leader: that one is raised as the server gave it (transient), not taken for an absent
    key (a dispatcher's checkpoint read as none would dispatch the log again from its
    start; a leader's lease read as lapsed would step down)."""
    try:
        return await kv.get(key)
    except KeyNotFoundError as e:
        answer = e.__context__
        if isinstance(answer, APIError) and is_transient(answer):
            raise answer from None
        return None


async def create_key(kv: KeyValue, key: str, value: bytes) -> int | None:
    """Create `key` if it does not exist: its revision, or None if it does. nats-py, refused,
    reads the key back to tell a deleted key (which it creates over) from a live one, and
    raises "not found" if that read misses the key: one that expired in between (a lease a
    starved leader did not renew). The create was refused all the same."""
    try:
        return await kv.create(key, value)
    except (KeyWrongLastSequenceError, KeyNotFoundError):
        return None


async def wait_for_streams(js: JetStreamContext, layout: Layout,
                           timeout: float = STREAMS_WAIT_SECONDS) -> None:
    """Readers and agents do not create the installation; they wait for the control plane
    to (quietly), and ride out a cluster that cannot answer yet (one line per attempt),
    both within `timeout`; then the last failure is raised."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    async def look() -> None:
        while True:
            try:
                await js.stream_info(layout.events_stream)
                await js.stream_info(layout.reports_stream)
                return
            except NotFoundError:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(STREAMS_POLL_SECONDS)  # polling for another's set-up

    await retry_within(look, "waiting for the installation's streams", timeout)


async def prepare_streams(admin: Access, layout: Layout, replicas: int) -> None:
    """Every stream and bucket, as `admin` (the only role that may create or update them);
    one try: a person or a deploy job is waiting."""
    nc = await connect(admin, f"{layout.prefix}-prepare", allow_reconnect=False)
    try:
        await ensure_all(nc.jetstream(), layout, replicas)
    finally:
        await nc.close()
