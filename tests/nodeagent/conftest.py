"""Node-agent fixtures on libvirt's real test driver.

Every `libvirt.open("test:///default")` in one process shares one fake host, so each test
names its domains uniquely and never relies on another test's leftovers.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import libvirt
import nats
import pytest

from controlplane.writer import Writer
from events.jetstream.streams import ensure_all
from events.language.subjects import Layout
from nodeagent.phases import Observation
from nodeagent.virterror import quiet_libvirt_errors
from nodeagent.watcher import LifecycleWatcher, start_event_loop
from projections.service import ReadService
from tests.nodeagent.helpers import Cluster

WAIT_SECONDS = 10.0


class Recorder:
    """Collects observations from libvirt's thread; tests wait on it, never sleep."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.seen: list[Observation] = []

    def __call__(self, observation: Observation) -> None:
        with self._changed:
            self.seen.append(observation)
            self._changed.notify_all()

    def wait_for(self, name: str, event: int) -> Observation:
        """The first observation of `event` on `name`, waiting for it to arrive."""

        def found() -> list[Observation]:
            return [o for o in self.seen if o.name == name and o.event == event]

        with self._changed:
            assert self._changed.wait_for(found, WAIT_SECONDS), f"no event {event} for {name}"
            return found()[0]

    def of(self, name: str) -> list[Observation]:
        with self._changed:
            return [o for o in self.seen if o.name == name]


@pytest.fixture
def conn() -> Iterator[libvirt.virConnect]:
    start_event_loop()
    quiet_libvirt_errors()
    connection = libvirt.open("test:///default")
    yield connection
    connection.close()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def watcher(conn: libvirt.virConnect, recorder: Recorder) -> Iterator[LifecycleWatcher]:
    with LifecycleWatcher(conn, recorder, node="node-test") as w:
        yield w


@pytest.fixture
def domain_xml() -> Callable[..., str]:
    """Test-driver domain XML with a fresh name (and uuid) per call.

    `on_poweroff="restart"` makes the test driver's guest ignore an ACPI shutdown (it emits
    no event and keeps running), which is how a test reaches the end of a grace period.
    """

    def make(name: str = "", uuid_: str = "", on_poweroff: str = "destroy") -> str:
        name = name or f"vmi-{uuid.uuid4().hex[:10]}"
        uuid_ = uuid_ or str(uuid.uuid4())
        return (
            f"<domain type='test'><name>{name}</name><uuid>{uuid_}</uuid>"
            "<memory unit='MiB'>64</memory><vcpu>1</vcpu><os><type>hvm</type></os>"
            f"<on_poweroff>{on_poweroff}</on_poweroff></domain>"
        )

    return make


@pytest.fixture
async def cluster(nats_url: str, prefix: str) -> AsyncIterator[Cluster]:
    layout = Layout(prefix)
    nc = await nats.connect(nats_url)
    await ensure_all(nc.jetstream(), layout, 1)
    writer = Writer(nc, layout)
    stop = asyncio.Event()
    reads = asyncio.ensure_future(ReadService(nc, layout).run(stop))
    try:
        yield Cluster(nc, writer, layout, f"node-{prefix}")
    finally:
        stop.set()
        await reads
        await nc.close()
