"""Real guests' serial consoles, published for `virtbus console`.

virtlogd writes what each guest prints on its serial port to `<run dir>/<namespace>/<name>/
virt-serial0-log` (`nodeagent.converter.console`). The agent reads each such log from where
its last publication ended and publishes the new bytes to the console stream, on the VMI
instance's subject (`Layout.console_subject`), in messages of at most
`CONSOLE_CHUNK_BYTES`. Only the read service reads them back, for those the policy lets see
a console (`projections.console`).

Each message says where in the log it ends (`END_HEADER`: the file's inode and offset), so
an agent that restarts reads the last one back and goes on from there: nothing is published
twice, nothing lost that the log still holds. virtlogd rotates a log that grows past its
limit (renames it, starts a new one): the open file is read to its end before the new one is
opened, so a rotation loses nothing either. A guest removed has its log read to the end
first (`forget`), so its last words (a power-off message) are published before its run
directory goes.
"""

from __future__ import annotations

import asyncio
import os
from typing import IO, Final

import structlog
from nats.aio.client import Client
from nats.errors import Error as NatsError

from events.jetstream.directget import DirectGetError, last_by_subject
from events.jetstream.streams import CONSOLE_CHUNK_BYTES
from events.jetstream.transient import describe
from events.language.subjects import Layout
from events.runtime.aio import pause_unless_stopped
from nodeagent.converter.console import SERIAL_LOG
from nodeagent.vmiref import VMIRef

log = structlog.get_logger(__name__)

CONSOLE_POLL_SECONDS: Final = 0.5
"""How often the agent looks for new console output: a reader sees a line this late at most
(virtlogd tells nobody when it writes)."""
END_HEADER: Final = "Virtbus-Console-End"
"""`<inode>:<offset>`: where in the console log a message's bytes end."""


class ConsoleLog:
    """One guest's console log, read forward from a position, across virtlogd's rotations."""

    def __init__(self, path: str, inode: int = 0, offset: int = 0) -> None:
        self.path = path
        self.file: IO[bytes] | None = None
        self.resume = (inode, offset)
        """Where the last publication ended: taken up when the log is opened, if it is the
        same file and still that long."""

    @property
    def position(self) -> tuple[int, int]:
        """(inode, offset) of what has been read."""
        if self.file is None:
            return self.resume
        return os.fstat(self.file.fileno()).st_ino, self.file.tell()

    def read(self, limit: int) -> bytes:
        """Up to `limit` new bytes: the rest of the open file, then the one now at the path
        (a rotation), or b'' when there is nothing new yet."""
        if self.file is not None:
            data = self.file.read(limit)
            if data or self._same_file():
                return data
            self.file.close()  # rotated or removed, and read to its end
            self.file = None
        try:
            self.file = open(self.path, "rb")  # noqa: SIM115 (kept open across reads)
        except FileNotFoundError:
            return b""
        inode, offset = self.resume
        stat = os.fstat(self.file.fileno())
        if stat.st_ino == inode and stat.st_size >= offset:
            self.file.seek(offset)
        self.resume = (0, 0)
        return self.file.read(limit)

    def _same_file(self) -> bool:
        assert self.file is not None
        try:
            return os.stat(self.path).st_ino == os.fstat(self.file.fileno()).st_ino
        except FileNotFoundError:
            return False

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class ConsolePublisher:
    """Publishes the console logs of one node's real guests (see the module)."""

    def __init__(self, nc: Client, layout: Layout, node: str, run_dir: str) -> None:
        self.nc, self.layout, self.node, self.run_dir = nc, layout, node, run_dir
        self.logs: dict[VMIRef, ConsoleLog] = {}
        self.log = log.bind(node=node)

    def _subject(self, ref: VMIRef) -> str:
        return self.layout.console_subject(self.node, ref.namespace, ref.name, ref.uid)

    async def follow(self, ref: VMIRef) -> None:
        """Publish `ref`'s console from where the last publication of it ended (a guest
        adopted at start) or from its start (a new one)."""
        inode, offset = 0, 0
        try:
            last = await last_by_subject(self.nc, self.layout.console_stream,
                                         self._subject(ref))
        except (TimeoutError, NatsError, DirectGetError) as e:
            self.log.warning("console position not read back; publishing the log from its "
                             "start", vmi=ref.name, namespace=ref.namespace, error=describe(e))
            last = None
        if last is not None:
            end = (last.headers or {}).get(END_HEADER, "")
            inode_text, _, offset_text = end.partition(":")
            if inode_text.isdigit() and offset_text.isdigit():
                inode, offset = int(inode_text), int(offset_text)
        path = os.path.join(self.run_dir, ref.namespace, ref.name, SERIAL_LOG)
        self.logs[ref] = ConsoleLog(path, inode, offset)

    async def forget(self, ref: VMIRef) -> None:
        """Publish what is left of `ref`'s console, then stop following it."""
        console = self.logs.pop(ref, None)
        if console is not None:
            await self._publish(ref, console)
            console.close()

    async def serve(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for ref, console in list(self.logs.items()):
                await self._publish(ref, console)
            await pause_unless_stopped(stop, CONSOLE_POLL_SECONDS)

    async def _publish(self, ref: VMIRef, console: ConsoleLog) -> None:
        """Everything new in the log, a message at a time; a message NATS does not take is
        read again at the next look (its id makes a repeat one message)."""
        js = self.nc.jetstream()
        while True:
            start = console.position
            try:
                data = console.read(CONSOLE_CHUNK_BYTES)
            except OSError as e:
                self.log.warning("console log not read", vmi=ref.name, path=console.path,
                                 error=str(e))
                return
            if not data:
                return
            inode, end = console.position
            try:
                await js.publish(self._subject(ref), data, headers={
                    END_HEADER: f"{inode}:{end}", "Nats-Msg-Id": f"{ref.uid}:{inode}:{end}"})
            except (TimeoutError, NatsError) as e:
                self.log.warning("console output not published; trying again", vmi=ref.name,
                                 namespace=ref.namespace, error=describe(e))
                console.close()
                console.resume = start
                return
