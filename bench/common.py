"""Set-up shared by the benchmarks: a server, a store on a fresh prefix, events, timing, output.

Every figure is measured next to the raw layer beneath it in the same run, so a ratio says
what the store adds on this machine, whatever this machine is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import nats
from eventsourcing.persistence import JSONTranscoder, StoredEvent
from eventsourcing.utils import Environment
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import NotFoundError

from events.jetstream.server import EmbeddedNats
from events.jetstream.store import JetStreamApplicationRecorder, JetStreamFactory
from events.language.codec import Event, EventMapper, event_type, now
from events.language.subjects import Layout

Figures = dict[str, float | int | str]


@event_type("BenchEvent")
class BenchEvent(Event, frozen=True, kw_only=True):
    """A small event of about the size of a real status change."""

    value: int
    note: str = "bench"


@dataclass(frozen=True)
class Rate:
    """`count` operations in `seconds` of wall-clock time."""

    count: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def us_each(self) -> float:
        return 1e6 * self.seconds / self.count if self.count else 0.0

    def show(self, label: str, unit: str = "events") -> None:
        print(f"{label:<38} {self.count:>7} {unit} in {self.seconds:8.3f} s = "
              f"{self.per_s:>10,.0f}/s ({self.us_each:8.1f} us each)")


def timed(count: int, work: Callable[[], object]) -> Rate:
    """The rate of `work`, which does `count` operations, by `time.perf_counter()`."""
    start = time.perf_counter()
    work()
    return Rate(count, time.perf_counter() - start)


async def timed_async(count: int, work: Callable[[], Awaitable[object]]) -> Rate:
    """As `timed`, for a coroutine function, on the running loop."""
    start = time.perf_counter()
    await work()
    return Rate(count, time.perf_counter() - start)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(
        values) > 1 else values[0]


def positive(text: str) -> int:
    """An argparse type: every count here divides something, so it must be at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parser(description: str, events: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=positive, default=events, help="events per measurement")
    p.add_argument("--nats-url", default=None,
                   help="an existing NATS server (default: start one in a temp dir)")
    return p


@contextmanager
def nats_server(url: str | None) -> Iterator[str]:
    """`url` if given, else a fresh embedded nats-server in a temp dir for this run only."""
    with nats_server_process(url) as (served, _pid):
        yield served


@contextmanager
def nats_server_process(url: str | None) -> Iterator[tuple[str, int | None]]:
    """As `nats_server`, with the server's process id when it was started here."""
    if url:
        yield url, None
        return
    with tempfile.TemporaryDirectory(prefix="virtbus-bench-") as tmp, \
            EmbeddedNats(Path(tmp)) as server:
        yield server.url, server.process.pid if server.process is not None else None


def raw_stream(layout: Layout) -> str:
    """The plain stream beside the store's: no dedupe window, no atomic batches, no checks."""
    return f"{layout.upper}_RAW"


def raw_subject(layout: Layout, token: int | str) -> str:
    return f"{layout.prefix}.raw.{token}"


@dataclass(frozen=True)
class Store:
    """The real store on a prefix of its own (its layout names the raw stream too)."""

    url: str
    layout: Layout
    recorder: JetStreamApplicationRecorder


@contextmanager
def open_store(url: str) -> Iterator[Store]:
    """A store on a fresh prefix (so sequences start at 1); its streams are deleted after,
    so a run against `--nats-url` leaves nothing behind."""
    layout = Layout("bench" + uuid.uuid4().hex[:8])
    factory = JetStreamFactory(Environment(env={
        JetStreamFactory.NATS_URL: url, JetStreamFactory.VIRTBUS_PREFIX: layout.prefix,
    }))
    try:
        recorder = factory.application_recorder()
        assert isinstance(recorder, JetStreamApplicationRecorder)
        asyncio.run(_raw_streams(url, layout, create=True))
        yield Store(url, layout, recorder)
    finally:
        factory.close()
        asyncio.run(_raw_streams(url, layout, create=False))


async def _raw_streams(url: str, layout: Layout, *, create: bool) -> None:
    """Create the plain stream the raw figures use, or delete every stream of this run."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        if create:
            await js.add_stream(StreamConfig(name=raw_stream(layout),
                                             subjects=[raw_subject(layout, ">")],
                                             storage=StorageType.FILE))
            return
        for name in (raw_stream(layout), layout.events_stream):
            with suppress(NotFoundError):
                await js.delete_stream(name)
    finally:
        await nc.close()


_mapper = EventMapper(transcoder=JSONTranscoder())


def aggregate(n: int, group: str = "a") -> str:
    """The id of the n-th bench aggregate of `group`, shaped like a real one
    (`kind.namespace.name`)."""
    return f"bench.default.{group}{n}"


def stored_events(placements: Sequence[tuple[str, int]]) -> tuple[list[StoredEvent], Rate]:
    """One mapped event per (aggregate id, version), and how fast mapping went."""
    stamp = now()
    start = time.perf_counter()
    out = [
        _mapper.to_stored_event(BenchEvent(
            originator_id=agg, originator_version=version, timestamp=stamp, actor="bench",
            correlation_id="c" * 32, causation_id="k" * 32, value=version,
        ))
        for agg, version in placements
    ]
    return out, Rate(len(out), time.perf_counter() - start)


def emit(headline: Rate, raw: Rate, extra: Figures) -> None:
    """The last line: one JSON object, the headline path against the raw layer first."""
    figures: Figures = {
        "events": headline.count,
        "seconds": round(headline.seconds, 6),
        "per_s": round(headline.per_s, 1),
        "raw_per_s": round(raw.per_s, 1),
        "ratio": round(headline.per_s / raw.per_s, 4) if raw.per_s else 0.0,
        **extra,
    }
    print(json.dumps(figures))
