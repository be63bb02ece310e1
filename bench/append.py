"""Append throughput of the store against plain JetStream publishes, in the same run.

`python -m bench.append [--events N] [--batch B] [--nats-url URL]`

Headline: single-event appends to distinct aggregates through `insert_events` (the
optimistic-concurrency path: bridge, expected subject sequence, dedupe id) against a
sequential `js.publish` of payloads of the same size to a plain stream, straight from asyncio.
Also: the async core without a bridge trip per append, atomic batches of B events, and what
one trip through the bridge costs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import nats
from eventsourcing.persistence import StoredEvent

from bench.common import (
    Rate,
    Store,
    aggregate,
    emit,
    nats_server,
    open_store,
    parser,
    positive,
    raw_subject,
    stored_events,
    timed,
    timed_async,
)
from events.jetstream.bridge import DEFAULT_TIMEOUT, NatsBridge
from events.jetstream.datastore import MAX_BATCH

WARMUP = 50
"""Operations run before each timed loop, so connection set-up is not counted."""


def append_each(store: Store, events: Sequence[StoredEvent]) -> None:
    for event in events:
        store.recorder.insert_events([event])


def append_on_loop(store: Store, events: Sequence[StoredEvent]) -> None:
    """The async core awaited on the bridge's own loop, one bridge trip for all of them: the
    difference to `append_each` is what the bridge really costs with a round trip in flight."""
    ds = store.recorder.datastore

    async def each() -> None:
        for event in events:
            await ds.append(ds.events, [event])

    ds.bridge.run(each(), timeout=DEFAULT_TIMEOUT + 0.01 * len(events))


def append_batches(store: Store, events: Sequence[StoredEvent], batch: int) -> None:
    for start in range(0, len(events), batch):
        store.recorder.insert_events(events[start : start + batch])


async def raw_publish(store: Store, payloads: Sequence[bytes]) -> Rate:
    """Sequential publishes, each ack awaited, on a connection of our own: no bridge."""
    nc = await nats.connect(store.url)
    js = nc.jetstream()

    async def publish(first: int, count: int) -> None:
        for n in range(first, first + count):
            await js.publish(raw_subject(store.layout, n), payloads[n % len(payloads)])

    try:
        await publish(0, WARMUP)
        return await timed_async(len(payloads), lambda: publish(WARMUP, len(payloads)))
    finally:
        await nc.close()


async def noop() -> None:
    """Nothing at all, so that running it measures only the way there and back."""


def bridge_cost(bridge: NatsBridge, count: int) -> tuple[Rate, Rate]:
    """`count` no-ops through `NatsBridge.run`, then `count` awaited directly on a loop."""

    def through_bridge() -> None:
        for _ in range(count):
            bridge.run(noop())

    async def direct() -> None:
        for _ in range(count):
            await noop()

    return timed(count, through_bridge), asyncio.run(timed_async(count, direct))


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__ or "", events=5000)
    p.add_argument("--batch", type=positive, default=100,
                   help=f"events per atomic append (at most {MAX_BATCH})")
    args = p.parse_args(argv)
    if args.batch > MAX_BATCH:
        p.error(f"--batch: an atomic append holds at most {MAX_BATCH} events")
    n, b = args.events, args.batch
    singles, mapping = stored_events([(aggregate(i), 1) for i in range(WARMUP + n)])
    on_loop, _ = stored_events([(aggregate(i, "l"), 1) for i in range(n)])
    batched, _ = stored_events([(aggregate(i // b, "b"), i % b + 1) for i in range(n)])
    payload = len(singles[0].state)
    print(f"{n} events, {payload}-byte payloads, batches of {b}")
    with nats_server(args.nats_url) as url, open_store(url) as store:
        append_each(store, singles[:WARMUP])
        single = timed(n, lambda: append_each(store, singles[WARMUP:]))
        core = timed(n, lambda: append_on_loop(store, on_loop))
        batch = timed(n, lambda: append_batches(store, batched, b))
        raw = asyncio.run(raw_publish(store, [s.state for s in singles[WARMUP:]]))
        via_bridge, direct = bridge_cost(store.recorder.datastore.bridge, n)
    mapping.show("map (EventMapper.to_stored_event)")
    single.show("store: single-event appends")
    core.show("store: append() on the bridge's loop")
    batch.show(f"store: atomic batches of {b}")
    raw.show("raw: js.publish, ack awaited")
    via_bridge.show("bridge: no-op via NatsBridge.run", "calls")
    direct.show("bridge: no-op awaited directly", "calls")
    print(f"store/raw {single.per_s / raw.per_s:.2f}; batched/raw {batch.per_s / raw.per_s:.2f}; "
          f"a no-op bridge trip costs {via_bridge.us_each - direct.us_each:.1f} us, "
          f"a bridge trip around an append {single.us_each - core.us_each:.1f} us")
    emit(single, raw, {
        "raw_seconds": round(raw.seconds, 6),
        "payload_bytes": payload,
        "core_per_s": round(core.per_s, 1),
        "core_us": round(core.us_each, 2),
        "batch": b,
        "batch_per_s": round(batch.per_s, 1),
        "batch_ratio": round(batch.per_s / raw.per_s, 4),
        "map_per_s": round(mapping.per_s, 1),
        "bridge_us": round(via_bridge.us_each, 2),
        "direct_us": round(direct.us_each, 3),
        "bridge_overhead_us": round(via_bridge.us_each - direct.us_each, 2),
        "append_us": round(single.us_each, 2),
        "raw_us": round(raw.us_each, 2),
    })


if __name__ == "__main__":
    main()
