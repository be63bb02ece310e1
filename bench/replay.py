"""Projection rebuild rate through the store against raw JetStream delivery, in the same run.

`python -m bench.replay [--events N] [--aggregates A] [--nats-url URL]`

Writes N events over A aggregates in atomic batches, then times, over the same messages:
(a) a rebuild as a projection does it: `select_notifications` pages,
`events.language.codec.decode`,
folded into a read model; (b) an ordered push consumer receiving every raw message, decoding
nothing; (c) msgspec decoding the same payloads, and `codec.decode` doing it with its topic
lookup, so decode and transport can be told apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import msgspec
import nats
from eventsourcing.persistence import StoredEvent
from nats.aio.msg import Msg

from bench import common
from bench.common import BenchEvent, Store
from events.jetstream.datastore import MAX_BATCH
from events.language.codec import decode

PAGE = 1000
"""Notifications a rebuild asks for at a time, as a projection runner would."""
DELIVERY_TIMEOUT = 120.0
"""How long the raw consumer may take before the run gives up (a bound, not a measurement)."""

ReadModel = dict[str, tuple[int, int]]
"""Aggregate id -> (events seen, last version): the smallest projection that must decode."""


def write(store: Store, events: Sequence[StoredEvent]) -> None:
    for start in range(0, len(events), MAX_BATCH):
        store.recorder.insert_events(events[start : start + MAX_BATCH])


def rebuild(store: Store, expected: int) -> ReadModel:
    """Read every notification in pages, decode it and fold it in, as a projection would."""
    model: ReadModel = {}
    start = 1
    for _page in range(expected // PAGE + 2):
        page = store.recorder.select_notifications(start, PAGE)
        for notification in page:
            event = decode(notification.topic, notification.state)
            count, _ = model.get(event.originator_id, (0, 0))
            model[event.originator_id] = (count + 1, event.originator_version)
        if len(page) < PAGE:
            break
        start = page[-1].id + 1
    return model


async def raw_delivery(store: Store, expected: int) -> common.Rate:
    """An ordered push consumer over the event stream, counting messages, decoding none."""
    nc = await nats.connect(store.url)
    js = nc.jetstream()
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    received = 0

    async def count(_msg: Msg) -> None:
        nonlocal received
        received += 1
        if received == expected:
            done.set_result(None)

    async def consume() -> None:
        sub = await js.subscribe(store.layout.events_filter(), cb=count, ordered_consumer=True)
        await asyncio.wait_for(done, DELIVERY_TIMEOUT)
        await sub.unsubscribe()

    try:
        return await common.timed_async(expected, consume)
    finally:
        await nc.close()


def decode_all(payloads: Sequence[tuple[str, bytes]], one: Callable[[str, bytes], object]
               ) -> None:
    for topic, state in payloads:
        one(topic, state)


def main(argv: Sequence[str] | None = None) -> None:
    p = common.parser(__doc__ or "", events=20000)
    p.add_argument("--aggregates", type=common.positive, default=100,
                   help="aggregates the events span")
    args = p.parse_args(argv)
    n, a = args.events, args.aggregates
    events, _ = common.stored_events([(common.aggregate(i % a), i // a + 1) for i in range(n)])
    payloads = [(s.topic, s.state) for s in events]
    print(f"{n} events over {a} aggregates, {len(events[0].state)}-byte payloads")
    with common.nats_server(args.nats_url) as url, common.open_store(url) as store:
        written = common.timed(n, lambda: write(store, events))
        model: ReadModel = {}
        replay = common.timed(n, lambda: model.update(rebuild(store, n)))
        raw = asyncio.run(raw_delivery(store, n))
    seen = sum(count for count, _ in model.values())
    if seen != n:
        raise RuntimeError(f"rebuild saw {seen} of {n} events: the figures would be wrong")
    msgspec_decoder = msgspec.msgpack.Decoder(BenchEvent)
    raw_decode = common.timed(
        n, lambda: decode_all(payloads, lambda _topic, state: msgspec_decoder.decode(state)))
    codec_decode = common.timed(n, lambda: decode_all(payloads, decode))
    written.show(f"write: atomic batches of {MAX_BATCH}")
    replay.show("store: rebuild (page, decode, fold)")
    raw.show("raw: ordered push consumer")
    raw_decode.show("decode: msgspec Decoder")
    codec_decode.show("decode: events.language.codec.decode")
    print(f"rebuild/raw {replay.per_s / raw.per_s:.2f}; decoding is "
          f"{100 * codec_decode.seconds / replay.seconds:.0f}% of the rebuild")
    common.emit(replay, raw, {
        "raw_seconds": round(raw.seconds, 6),
        "aggregates": len(model),
        "write_per_s": round(written.per_s, 1),
        "decode_per_s": round(raw_decode.per_s, 1),
        "codec_decode_per_s": round(codec_decode.per_s, 1),
        "rebuild_us": round(replay.us_each, 3),
        "raw_us": round(raw.us_each, 3),
    })


if __name__ == "__main__":
    main()
