"""A decision that reads every object of a kind (a VMI's presets) on the writer's memory once
it has folded the log, as the control loop's does: answered without reading the log, and
still guarded, so a memory behind the log (another writer's preset; its own write not
folded yet) decides again on the log's scan rather than miss an object."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controlplane.writer import Writer
from events.jetstream.connect import connect
from events.jetstream.directget import read_all, sequence
from events.jetstream.streams import ensure_all
from events.language.kinds.vm import VirtualMachineInstanceCreated
from events.language.messages import Command
from events.language.subjects import Layout
from projections.follower import read_event
from tests.store.test_presets import APPLIED, preset, vmi
from tests.store.test_write_path import Writers

CORES = {"cpu": {"cores": 2}}
"""Every preset here sets the same: presets that agree are all applied."""


@pytest.fixture
async def writers(nats_url: str, prefix: str) -> AsyncIterator[Writers]:
    """Two writers on connections of their own, each memory taken as complete."""
    layout = Layout(prefix)
    connections = [await connect(nats_url, f"writer-{n}") for n in "ab"]
    await ensure_all(connections[0].jetstream(), layout)
    try:
        yield Writers(layout, connections, complete=True)
    finally:
        for nc in connections:
            await nc.close()


def apply(manifest: dict[str, Any]) -> Command:
    return Command(id=str(uuid.uuid4()), actor="user:dana", kind=manifest["kind"],
                   verb="apply", namespace="default", name=manifest["metadata"]["name"],
                   manifest=manifest)


async def fold(writer: Writer, layout: Layout) -> None:
    """Every event of the log into the writer's memory, as the control loop feeds it."""
    nc = writer.handler.log.nc
    for msg in await read_all(nc, layout.events_stream, layout.events_filter()):
        if (event := read_event(msg)) is not None:
            writer.handler.memory.observe(event, sequence(msg))


async def presets_applied(writer: Writer, layout: Layout, name: str) -> list[str]:
    """The presets the VMI `name` was created with, as its first event records them."""
    msgs = await read_all(writer.handler.log.nc, layout.events_stream,
                          layout.aggregate_subject(f"vmi.default.{name}"))
    created = next(e for m in msgs
                   if isinstance(e := read_event(m), VirtualMachineInstanceCreated))
    return sorted(k[len(APPLIED):] for k in created.metadata.annotations if k.startswith(APPLIED))


async def test_a_scan_is_answered_from_a_complete_memory_and_still_guarded(
        writers: Writers, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, layout = writers.a, writers.b, writers.layout
    scans_read: list[str] = []
    read_subjects = a.handler.log.subjects

    async def counted(stream: str, subject: str) -> list[str]:
        scans_read.append(subject)
        return await read_subjects(stream, subject)

    monkeypatch.setattr(a.handler.log, "subjects", counted)
    assert (await a.execute(apply(preset("small", CORES)))).outcome.accepted
    await fold(a, layout)

    assert (await a.execute(apply(vmi("web")))).outcome.accepted
    assert await presets_applied(a, layout, "web") == ["small"]
    assert scans_read == []  # the memory knew every preset

    # Another writer's preset this memory never folded, then one of its own it has not
    # folded yet (its sequence is the log's newest of the kind): the guard meets the log's
    # newest preset, the decision scans the log and sees all three.
    assert (await b.execute(apply(preset("large", CORES)))).outcome.accepted
    assert (await a.execute(apply(preset("tiny", CORES)))).outcome.accepted
    assert (await a.execute(apply(vmi("db")))).outcome.accepted
    assert await presets_applied(a, layout, "db") == ["large", "small", "tiny"]
    assert len(scans_read) == 1


async def test_a_scan_first_answered_after_an_unfolded_write_is_still_guarded(
        writers: Writers) -> None:
    """The memory's first scan of the kind comes after its own preset, not folded yet, the
    log's newest: that sequence is no guard of what the memory holds."""
    a, b, layout = writers.a, writers.b, writers.layout
    assert (await b.execute(apply(preset("large", CORES)))).outcome.accepted
    assert (await a.execute(apply(preset("tiny", CORES)))).outcome.accepted
    assert (await a.execute(apply(vmi("db")))).outcome.accepted
    assert await presets_applied(a, layout, "db") == ["large", "tiny"]
