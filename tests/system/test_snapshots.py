"""Read-model snapshots are derived data: every answer (`get --at`, `watch --since`, the read
service and the control plane after a restart) is the same from a snapshot and the log's
tail as from the whole log, and a corrupt, foreign or cut-short snapshot is passed over and
counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from controlplane.user.client import Client
from projections import audit
from projections.cluster import ClusterState
from projections.snapshots import (
    CORRUPT,
    FOREIGN,
    SNAPSHOT_SCHEMA,
    UNREADABLE,
    Snapshots,
    encode_state,
    object_name,
)
from tests.system.harness import (
    System,
    eventually,
    last_sequence,
    vm_manifest,
    vm_status,
    vmi_absent,
    vmi_phase,
)

KINDS = ("VirtualMachine", "VirtualMachineInstance", "Node")
NAMES = ("a", "b", "c", "late", "last")


async def at(vb: Client, sequence: int) -> dict[str, list[dict[str, Any]]]:
    """Every object of `KINDS` at `sequence`, and each VM and VMI by name: a named read
    (its object's own subjects, no snapshot) is the same as that object in the list (the
    whole cluster, from a snapshot and the tail)."""
    listed = {kind: await vb.query_at(sequence, kind) for kind in KINDS}
    for kind in KINDS[:2]:
        for name in NAMES:
            named = await vb.query_at(sequence, kind, "default", name)
            assert named == [o for o in listed[kind] if o["metadata"]["name"] == name], \
                (kind, name, sequence)
    return listed


async def watched(vb: Client, since: int, until: int) -> list[tuple[int, Any]]:
    """Every VM change from `since` up to the one at `until`, as `watch --since` gives it."""
    out: list[tuple[int, Any]] = []
    async for change in vb.watch("VirtualMachine", since=since):
        out.append((change.sequence, change.object))
        if change.sequence >= until:
            return out
    raise AssertionError("the watch ended")


async def answers(vb: Client, sequences: list[int], since: int,
                  until: int) -> dict[str, Any]:
    return {"at": [await at(vb, s) for s in sequences],
            "watch": await watched(vb, since, until)}


async def plant_hostile_snapshots(vb: Client, newer_than: int) -> None:
    """Newer than the good snapshot, so a reader meets them first: bytes that are no
    snapshot, and a snapshot another code version wrote."""
    store = await vb.nc.jetstream().object_store(vb.layout.read_snapshots_bucket)
    await store.put(object_name(newer_than + 1), b"\x93not a snapshot")
    foreign = msgspec.msgpack.decode(encode_state(ClusterState()))
    foreign["schema"], foreign["sequence"] = "0" * len(SNAPSHOT_SCHEMA), newer_than + 2
    await store.put(object_name(newer_than + 2), msgspec.msgpack.encode(foreign))
    await store.put(f"{'f' * len(SNAPSHOT_SCHEMA)}.{newer_than + 3:012d}", b"")


async def test_answers_are_the_same_with_and_without_snapshots(system: System,
                                                                 vb: Client) -> None:
    await vb.apply(vm_manifest("a"), vm_manifest("b"), vm_manifest("c", "Halted"))
    await eventually(lambda: vmi_phase(vb, "a", "Running"), what="a Running")
    await eventually(lambda: vmi_phase(vb, "b", "Running"), what="b Running")
    [late] = await vb.apply(vm_manifest("late"))
    snapped = min(late.sequences) - 1  # the next event is the late VM's creation
    snapshots = Snapshots(vb.nc, vb.layout)
    assert await snapshots.save(await audit.state_at(vb.nc, vb.layout, snapped))

    await eventually(lambda: vmi_phase(vb, "late", "Running"), what="late Running")
    await vb.act("VirtualMachine", "stop", "default", "b")
    await eventually(lambda: vmi_absent(vb, "b"), what="b stopped")
    [last] = await vb.apply(vm_manifest("last", "Halted"))
    until = max(last.sequences)
    head = await last_sequence(vb)
    await plant_hostile_snapshots(vb, head)

    sequences = [snapped, snapped + 1, until, head]
    with_snapshots = await answers(vb, sequences, snapped + 1, until)
    restored = await snapshots.latest()
    assert restored is not None and restored.last_sequence == snapped
    assert snapshots.ignored == {CORRUPT: 1, FOREIGN: 2}

    # The read service and the control plane, restarted, start from the snapshot.
    before = {kind: await vb.query(kind, after=head) for kind in KINDS}
    for name in ("projections", "controlplane"):
        system.kill(name)
        system.start(name)
    after = await eventually(lambda: _all(vb, head), what="the read service back")
    assert after == before
    await vb.act("VirtualMachine", "start", "default", "c")  # the control plane acts
    await eventually(lambda: vm_status(vb, "c", "Running"), what="c Running")
    for name in ("projections", "controlplane"):
        assert restored_at(system.logs / f"{name}.log") == [snapped], name

    await vb.nc.jetstream().purge_stream(vb.layout.read_snapshots_stream)
    assert await Snapshots(vb.nc, vb.layout).latest() is None
    assert await answers(vb, sequences, snapped + 1, until) == with_snapshots


def restored_at(log: Path) -> list[int]:
    """The sequences of the snapshots a process started from, as its log says."""
    return [line["sequence"] for line in json_lines(log)
            if line.get("event") == "read model restored from a snapshot"]


def json_lines(log: Path) -> list[dict[str, Any]]:
    """The JSON records of a running process's log: a last line still being written (no
    newline yet) is not one, nor is a line that does not parse."""
    records: list[dict[str, Any]] = []
    for line in log.read_text(errors="replace").splitlines(keepends=True):
        if line.startswith("{") and line.endswith("\n"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


async def _all(vb: Client, head: int) -> dict[str, list[dict[str, Any]]] | None:
    got = {kind: await vb.query(kind, after=head) for kind in KINDS}
    return got if got["VirtualMachine"] else None


async def test_a_snapshot_the_ring_cut_short_is_passed_over(vb: Client) -> None:
    """The ring drops a snapshot's oldest chunks first while its meta stays: the reader
    counts the chunks and passes over it at once (no wait for chunks that will never come),
    and takes the older, whole one."""
    await vb.apply(vm_manifest("a"), vm_manifest("b"))
    head = await last_sequence(vb)
    whole = await audit.state_at(vb.nc, vb.layout, head)
    snapshots = Snapshots(vb.nc, vb.layout)
    assert await snapshots.save(whole)
    store = await vb.nc.jetstream().object_store(vb.layout.read_snapshots_bucket)
    cut = await store.put(object_name(head + 1), encode_state(whole))
    assert cut.chunks == 1
    await vb.nc.jetstream().purge_stream(
        vb.layout.read_snapshots_stream,
        subject=f"$O.{vb.layout.read_snapshots_bucket}.C.{cut.nuid}")

    restored = await snapshots.latest()
    assert restored is not None and restored.last_sequence == head
    assert snapshots.ignored == {UNREADABLE: 1}
    assert encode_state(restored) == encode_state(whole)  # read back exactly
