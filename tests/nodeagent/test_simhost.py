"""A simulated host kept in a file comes back, through a new connection, with its guests:
same uuid, metadata and state; `--sim-state` is refused off the test driver."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import libvirt
import pytest

from nodeagent.converter.identity import VMI_METADATA_NS
from nodeagent.guests import vmi_of
from nodeagent.hostfile import HostFile
from nodeagent.virterror import quiet_libvirt_errors
from nodeagent.vmiref import VMIRef


def guest(name: str) -> str:
    """Test-driver domain XML carrying the VMI metadata the agent adopts guests by."""
    return (
        f"<domain type='test'><name>{name}</name><uuid>{uuid.uuid4()}</uuid>"
        f"<metadata><v:vmi xmlns:v='{VMI_METADATA_NS}' uid='uid-{name}' namespace='ns' "
        f"name='{name}'/></metadata>"
        "<memory unit='MiB'>64</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>"
    )


@contextlib.contextmanager
def opened(host: HostFile) -> Iterator[libvirt.virConnect]:
    """A connection to the host as its file holds it now."""
    conn = libvirt.open(host.uri)
    try:
        yield conn
    finally:
        conn.close()


def test_a_saved_host_comes_back_with_its_guests(tmp_path: Path) -> None:
    quiet_libvirt_errors()
    host = HostFile(tmp_path / "a dir" / "host.xml")
    with opened(host) as conn:
        assert conn.listAllDomains(0) == [], "a missing file is an empty host"
        running = conn.defineXML(guest("running"))
        running.create()
        paused = conn.defineXML(guest("paused"))
        paused.create()
        paused.suspend()
        transient = conn.createXML(guest("transient"), 0)
        conn.defineXML(guest("off"))
        before = {d.name(): d.UUIDString() for d in (running, paused, transient)}
        host.save(conn)

    with opened(host) as again:
        found = {d.name(): d for d in again.listAllDomains(0)}
        assert {name: d.UUIDString() for name, d in found.items()} == before, \
            "active guests only: a shut-off domain cannot say why it stopped"
        assert found["running"].state()[0] == libvirt.VIR_DOMAIN_RUNNING
        assert found["paused"].state()[0] == libvirt.VIR_DOMAIN_PAUSED
        assert found["transient"].state()[0] == libvirt.VIR_DOMAIN_RUNNING
        assert not found["transient"].isPersistent()
        assert found["running"].isPersistent()
        assert vmi_of(found["paused"], "virtbus") == VMIRef("ns", "paused", "uid-paused")


@pytest.mark.parametrize("uri", ["qemu:///system", "test:///elsewhere.xml"])
def test_sim_state_is_refused_off_the_default_test_driver(uri: str, tmp_path: Path) -> None:
    """The real CLI, as its own process: refused before it connects anywhere."""
    run = subprocess.run(
        [sys.executable, "-m", "nodeagent", "run", "--node", "n", "--nats-url",
         "nats://127.0.0.1:1", "--libvirt-uri", uri, "--sim-state", str(tmp_path / "host.xml")],
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert "error: --sim-state keeps a simulated host in a file and needs --libvirt-uri " \
           f"test:///default, not '{uri}'" in run.stderr
    assert not (tmp_path / "host.xml").exists()


def test_each_save_writes_what_changed_since_the_last(tmp_path: Path) -> None:
    """Saves reuse each unchanged guest's part of the file: one paused since, one resumed
    since, and one started anew under the same uuid (another VMI with the same firmware
    uuid) between two saves, are written as they are now."""
    quiet_libvirt_errors()
    host = HostFile(tmp_path / "host.xml")
    with opened(host) as conn:
        conn.defineXML(guest("paused")).create()
        resumed = conn.defineXML(guest("resumed"))
        resumed.create()
        resumed.suspend()
        first = guest("again")
        conn.defineXML(first).create()
        host.save(conn)
        conn.lookupByName("paused").suspend()
        resumed.resume()
        old = conn.lookupByName("again")
        old.destroy()
        old.undefine()
        conn.defineXML(first.replace("uid='uid-again'", "uid='uid-new'")).create()
        host.save(conn)

    with opened(host) as again:
        assert again.lookupByName("paused").state()[0] == libvirt.VIR_DOMAIN_PAUSED
        assert again.lookupByName("resumed").state()[0] == libvirt.VIR_DOMAIN_RUNNING
        assert vmi_of(again.lookupByName("again"), "virtbus") == VMIRef("ns", "again", "uid-new")


def test_a_new_connection_is_saved_as_it_is(tmp_path: Path) -> None:
    """Ids number one connection's starts: a guest of a new connection under an id a guest
    of the last one had is written as itself."""
    quiet_libvirt_errors()
    host = HostFile(tmp_path / "host.xml")
    with opened(host) as first:
        first.defineXML(guest("first")).create()
        host.save(first)
    (tmp_path / "host.xml").unlink()
    with opened(host) as second:
        second.defineXML(guest("second")).create()
        assert second.lookupByName("second").ID() == 1
        host.save(second)

    with opened(host) as again:
        assert [d.name() for d in again.listAllDomains(0)] == ["second"]


def test_a_torn_host_file_is_a_host_that_lost_its_guests(tmp_path: Path) -> None:
    """What a power loss may leave (a host file cut short) opens as an empty host, kept beside
    it for a person to read, as a real host comes back from one without its guests."""
    quiet_libvirt_errors()
    path = tmp_path / "host.xml"
    path.write_text("<node>\n<domain type='test'><name>cut</na")
    host = HostFile(path)
    with opened(host) as conn:
        assert conn.listAllDomains(0) == []
    assert (tmp_path / "host.xml.torn").read_text().endswith("<name>cut</na")


class _RemovingWhileListed:
    """A connection on which a paused guest is removed (by the agent's work, on another
    thread) just after a save listed it."""

    def __init__(self, conn: libvirt.virConnect, name: str) -> None:
        self.conn, self.name = conn, name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.conn, attr)

    def listAllDomains(self, flags: int = 0) -> list[libvirt.virDomain]:
        listed: list[libvirt.virDomain] = self.conn.listAllDomains(flags)
        if flags & libvirt.VIR_CONNECT_LIST_DOMAINS_PAUSED:
            gone = self.conn.lookupByName(self.name)
            gone.destroy()
            gone.undefine()
        return listed


def test_a_guest_removed_while_a_save_looks_is_left_out(tmp_path: Path) -> None:
    quiet_libvirt_errors()
    host = HostFile(tmp_path / "host.xml")
    with opened(host) as conn:
        conn.defineXML(guest("stays")).create()
        removed = conn.defineXML(guest("removed"))
        removed.create()
        removed.suspend()
        host.save(cast(libvirt.virConnect, _RemovingWhileListed(conn, "removed")))

    with opened(host) as again:
        assert [d.name() for d in again.listAllDomains(0)] == ["stays"]
