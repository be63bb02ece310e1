"""The agent's console publisher (`nodeagent.console`) on real files and a real NATS: what a
guest writes is published once, in order, across virtlogd's rotations, and an agent that
restarts goes on where the last one's publication ended."""

from __future__ import annotations

import os
from pathlib import Path

from events.jetstream.directget import read_all
from events.jetstream.streams import CONSOLE_CHUNK_BYTES
from nodeagent.console import ConsoleLog, ConsolePublisher
from nodeagent.converter.console import SERIAL_LOG
from nodeagent.vmiref import VMIRef
from tests.nodeagent.helpers import Cluster

REF = VMIRef("ns", "guest", "uid-1")


def _log(run_dir: Path) -> Path:
    path = run_dir / REF.namespace / REF.name / SERIAL_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


async def _published(cluster: Cluster, node: str) -> bytes:
    subject = cluster.layout.console_subject(node, REF.namespace, REF.name, REF.uid)
    msgs = await read_all(cluster.nc, cluster.layout.console_stream, subject)
    return b"".join(m.data for m in msgs)


async def _flush(cluster: Cluster, node: str, run_dir: Path) -> ConsolePublisher:
    """A publisher (a new agent) following the guest, having published what it found."""
    publisher = ConsolePublisher(cluster.nc, cluster.layout, node, str(run_dir))
    await publisher.follow(REF)
    await publisher.forget(REF)  # publishes what is left, as before a guest's removal
    return publisher


async def test_a_restarted_agent_goes_on_where_the_last_one_ended(cluster: Cluster,
                                                                   tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.write_bytes(b"boot\n")
    await _flush(cluster, "n1", tmp_path)
    with log.open("ab") as out:
        out.write(b"x" * (CONSOLE_CHUNK_BYTES + 10) + b"\nready\n")
    await _flush(cluster, "n1", tmp_path)  # another agent: resumes, repeats nothing
    await _flush(cluster, "n1", tmp_path)
    assert await _published(cluster, "n1") == log.read_bytes()


async def test_a_rotated_log_is_read_to_its_end_then_the_new_one(tmp_path: Path) -> None:
    path = _log(tmp_path)
    path.write_bytes(b"first\n")
    console = ConsoleLog(str(path))
    assert console.read(1024) == b"first\n"
    with path.open("ab") as out:
        out.write(b"last of the old log\n")
    os.rename(path, f"{path}.0")  # virtlogd's rotation
    path.write_bytes(b"new log\n")
    assert console.read(1024) == b"last of the old log\n"
    assert console.read(1024) == b"new log\n"
    assert console.read(1024) == b""


async def test_a_log_recreated_since_is_read_from_its_start(tmp_path: Path) -> None:
    path = _log(tmp_path)
    path.write_bytes(b"a long first log\n")
    inode, offset = os.stat(path).st_ino, os.stat(path).st_size
    path.unlink()
    path.write_bytes(b"new\n")  # shorter than where the last publication ended
    assert ConsoleLog(str(path), inode, offset).read(1024) == b"new\n"
