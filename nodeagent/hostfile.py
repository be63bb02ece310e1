"""A simulated (libvirt test-driver) host kept in a file, so it outlives its agent.

`test:///default` lives inside the process that opens it: `kill -9` of its agent loses every
guest, where a real hypervisor's libvirtd would have kept them. libvirt's test driver also
opens a host described by a file, `test:///abs/path.xml` holding `<node><domain>…</domain>…
</node>`, where each domain may carry its state as `<test:runstate>`. `HostFile.save`
writes a connection's domains back in that form, so the next agent to open the file finds
its guests (same uuid, metadata and state) and adopts them as it adopts libvirtd's.

Only active domains (running, paused, ...) are written, transient ones marked so. The file
cannot say why a domain is in its state (the test driver loads each with reason unknown),
and a shut-off domain whose reason is lost cannot be judged (`phases.phase_for` makes it no
change): left out, it is a domain missing after agent restart, which is what it is. The
agent never keeps shut-off domains anyway; it undefines them once it has reported them.

A save costs what changed, not the host's size in libvirt calls: the active domains' ids come
in one call, the few not running and the few transient in one call each, and a domain is
read again only when it is new (the test driver numbers every start anew) or its state
changed. The file is written whole, without an fsync: what it has to outlive is its agent
(`kill -9`), and a write is in the kernel's page cache once it returns. A power loss is a
real host's loss of every guest; a file it left torn is opened as an empty host, the guests
gone, as a real host's would be (`uri`).
"""

from __future__ import annotations

import asyncio
import os
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import quote

import libvirt
import structlog

from nodeagent.defaults import TEST_DRIVER_SCHEME
from nodeagent.virterror import is_no_domain

log = structlog.get_logger(__name__)

TEST_NAMESPACE = "http://libvirt.org/schemas/domain/test/1.0"
EMPTY_HOST = "<node>\n</node>\n"


class HostFile:
    """The test-driver host kept in `path`; `save` may run on any thread (saves take turns)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).absolute()
        self._saving = threading.Lock()
        self._conn: libvirt.virConnect | None = None
        self._parts: dict[int, tuple[_Seen, str]] = {}
        """Each active domain's part of the file as last written, by its id in `_conn`,
        with what it was seen as then."""

    @property
    def uri(self) -> str:
        """The test-driver URI of the file, written as an empty host first when missing or
        torn (kept beside it as `<name>.torn`)."""
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write(EMPTY_HOST)
        else:
            try:
                ET.parse(self.path)  # the host's own file, written by `save`
            except ET.ParseError as err:
                torn = self.path.with_name(f"{self.path.name}.torn")
                log.warning("simulated host file torn: the host starts empty",
                            file=str(self.path), kept_as=str(torn), error=str(err))
                os.replace(self.path, torn)
                self._write(EMPTY_HOST)
        return TEST_DRIVER_SCHEME + quote(str(self.path))

    def save(self, conn: libvirt.virConnect) -> None:
        """Write the connection's active domains, each with its runstate, atomically."""
        with self._saving:
            if conn is not self._conn:  # ids number a connection's starts, not the host's
                self._conn, self._parts = conn, {}
            active = libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE
            ids = conn.listDomainsID()
            not_running: dict[int, int] = {}
            for dom in conn.listAllDomains(active | libvirt.VIR_CONNECT_LIST_DOMAINS_PAUSED
                                           | libvirt.VIR_CONNECT_LIST_DOMAINS_OTHER):
                try:
                    not_running[dom.ID()] = dom.state()[0]
                except libvirt.libvirtError as err:
                    if not is_no_domain(err):
                        raise  # else: gone while we looked, as below
            transient = {dom.ID() for dom in conn.listAllDomains(
                active | libvirt.VIR_CONNECT_LIST_DOMAINS_TRANSIENT)}
            parts: dict[int, tuple[_Seen, str]] = {}
            for domain_id in ids:
                seen = (not_running.get(domain_id, libvirt.VIR_DOMAIN_RUNNING),
                        domain_id not in transient)
                known = self._parts.get(domain_id)
                if known is not None and known[0] == seen:
                    parts[domain_id] = known
                    continue
                try:
                    parts[domain_id] = (seen, _with_runstate(conn.lookupByID(domain_id), seen))
                except libvirt.libvirtError as err:
                    if not is_no_domain(err):
                        raise  # else: gone while we looked; the next save agrees
            self._write("".join(["<node>\n", *(part for _, part in parts.values()),
                                 "</node>\n"]))
            self._parts = parts

    async def keep(self, conn: libvirt.virConnect) -> None:
        """`save`, off the event loop."""
        await asyncio.to_thread(self.save, conn)

    def _write(self, text: str) -> None:
        """Replace the file whole: a reader (the next agent) sees the old host or the new
        one, never a torn one, whichever process dies (see the module on power loss)."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.path)


_Seen = tuple[int, bool]
"""What a domain's part of the file is kept for, beside its id (a domain started again, even
under the same uuid, has a new one): its state and whether it is persistent. The agent
changes a running domain's live XML by none of its calls, only by starting a domain anew."""


def _with_runstate(dom: libvirt.virDomain, seen: _Seen) -> str:
    """The domain's XML with its state as the test driver reads it back."""
    state, persistent = seen
    xml = dom.XMLDesc(0)
    marks = f"<test:runstate xmlns:test='{TEST_NAMESPACE}'>{state}</test:runstate>"
    if not persistent:
        marks += f"<test:transient xmlns:test='{TEST_NAMESPACE}'/>"
    end = xml.rindex("</domain>")
    return f"{xml[:end]}  {marks}\n{xml[end:]}"

