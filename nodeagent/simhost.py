"""A simulated (libvirt test-driver) host kept in a file, so it outlives its agent.

`test:///default` lives inside the process that opens it: `kill -9` of its agent loses every
guest, where a real hypervisor's libvirtd would have kept them. libvirt's test driver also
opens a host described by a file, `test:///abs/path.xml` holding `<node><domain>…</domain>…
</node>`, where each domain may carry its state as `<test:runstate>`. `SimulatedHost.save`
writes a connection's domains back in that form, so the next agent to open the file finds
its guests (same uuid, metadata and state) and adopts them as it adopts libvirtd's.

Only active domains (running, paused, ...) are written, transient ones marked so. The file
cannot say why a domain is in its state (the test driver loads each with reason unknown),
and a shut-off domain whose reason is lost cannot be judged (`phases.phase_for` makes it no
change): left out, it is a domain missing after agent restart, which is what it is. The
agent never keeps shut-off domains anyway; it undefines them once it has reported them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from urllib.parse import quote

import libvirt

from nodeagent.lifecycle import TEST_DRIVER_SCHEME, SimulationRefused
from nodeagent.virterror import is_no_domain

TEST_DEFAULT_URI = "test:///default"
"""The one `--libvirt-uri` that `--sim-state` goes with: the test driver, its host in the file
(an empty `<node>` has test:///default's CPUs and memory, without its sample domain and NUMA
cells, which no agent uses)."""
TEST_NAMESPACE = "http://libvirt.org/schemas/domain/test/1.0"
EMPTY_HOST = "<node>\n</node>\n"


class SimulatedHost:
    """The test-driver host kept in `path`; `save` may run on any thread (saves take turns)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).absolute()
        self._saving = threading.Lock()
        self._parts: dict[str, tuple[_Seen, str]] = {}
        """Each domain's part of the file as last written, by uuid, with what it was seen
        as then: a save reads again only the domains that changed since (a host of a
        hundred guests would otherwise read and format every one for each change)."""

    @property
    def uri(self) -> str:
        """The test-driver URI of the file, written as an empty host first when missing."""
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write(EMPTY_HOST)
        return TEST_DRIVER_SCHEME + quote(str(self.path))

    def save(self, conn: libvirt.virConnect) -> None:
        """Write the connection's active domains, each with its runstate, atomically."""
        with self._saving:
            parts: dict[str, tuple[_Seen, str]] = {}
            for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                try:
                    uuid = dom.UUIDString()
                    seen = (dom.ID(), dom.state()[0], bool(dom.isPersistent()))
                    known = self._parts.get(uuid)
                    parts[uuid] = known if known is not None and known[0] == seen else (
                        seen, _with_runstate(dom, seen))
                except libvirt.libvirtError as err:
                    if not is_no_domain(err):
                        raise  # else: undefined while we looked; the next save agrees
            self._write("".join(["<node>\n", *(part for _, part in parts.values()),
                                 "</node>\n"]))
            self._parts = parts

    def _write(self, text: str) -> None:
        """Replace the file whole: a reader (the next agent) sees the old host or the new
        one, never a torn one, even after a power loss (the fsync before the rename)."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with tmp.open("w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)


_Seen = tuple[int, int, bool]
"""What a domain's part of the file is kept for: its id (a domain started again, even under
the same uuid, has a new one), its state and whether it is persistent. The agent changes a
running domain's live XML by none of its calls, only by starting a domain anew."""


def _with_runstate(dom: libvirt.virDomain, seen: _Seen) -> str:
    """The domain's XML with its state as the test driver reads it back."""
    _, state, persistent = seen
    xml = dom.XMLDesc(0)
    marks = f"<test:runstate xmlns:test='{TEST_NAMESPACE}'>{state}</test:runstate>"
    if not persistent:
        marks += f"<test:transient xmlns:test='{TEST_NAMESPACE}'/>"
    end = xml.rindex("</domain>")
    return f"{xml[:end]}  {marks}\n{xml[end:]}"


def for_agent(libvirt_uri: str, sim_state: str) -> SimulatedHost | None:
    """The host an agent keeps in `--sim-state`, refused with any other driver than
    test:///default (a real hypervisor keeps its own domains; another test file is a host
    of its own)."""
    if not sim_state:
        return None
    if libvirt_uri != TEST_DEFAULT_URI:
        raise SimulationRefused(
            f"--sim-state keeps a simulated host in a file and needs --libvirt-uri "
            f"{TEST_DEFAULT_URI}, not {libvirt_uri!r}"
        )
    return SimulatedHost(sim_state)
