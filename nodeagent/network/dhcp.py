"""DHCP for the guests on a bridge: one dnsmasq (Debian's dnsmasq-base, as libvirt's own
networks use) per bridge, answering only the MACs in its hosts file, each with its fixed
address, so a guest's address is known before it asks. It also serves DNS on the gateway,
forwarding to the node's resolvers.

dnsmasq runs as a daemon of its own and outlives the agent, as the guests do: a restarted
agent finds it by its pid file and keeps it (or starts it again if its configuration
changed). A hosts file change is a SIGHUP; a guest gone has its lease released
(`dhcp_release`, dnsmasq-utils), so its address is free at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec
import structlog

from nodeagent.network.tools import NetworkError, run

if TYPE_CHECKING:
    import ipaddress

    from nodeagent.network.nics import GuestNic

log = structlog.get_logger(__name__)

LEASE_SECONDS: Final = 3600
STOP_WAIT_SECONDS: Final = 10.0


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    mac: str
    ip: str
    client_id: str
    """'' when the client sent none."""


LEASE_FILE_READS: Final = 5
"""Reads of the lease file before taking the last one as it is (see `read_leases`)."""


def read_leases(path: Path) -> dict[str, Lease]:
    """dnsmasq's lease file (`<expiry> <mac> <ip> <hostname> <client id>`), by MAC; a line
    that is not one is skipped. dnsmasq rewrites the file in place (truncated, then written
    out), so a read can find it empty or half written: it is read until two reads in a row
    agree."""
    text, previous = _read_text(path), None
    for _ in range(LEASE_FILE_READS - 1):
        if text == previous:
            break
        text, previous = _read_text(path), text
    leases = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 5 and fields[0].isdigit():
            mac = fields[1].lower()
            leases[mac] = Lease(mac=mac, ip=fields[2],
                                client_id="" if fields[4] == "*" else fields[4])
    return leases


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


class Dnsmasq:
    """The dnsmasq of one bridge, its files in `directory`."""

    def __init__(self, directory: Path, bridge: str, gateway: ipaddress.IPv4Interface) -> None:
        self.directory, self.bridge, self.gateway = directory, bridge, gateway
        self.conf = directory / "dnsmasq.conf"
        self.hosts = directory / "dnsmasq.hosts"
        self.leases = directory / "dnsmasq.leases"
        self.pid_file = directory / "dnsmasq.pid"

    def configuration(self) -> str:
        return "\n".join([
            f"# virtbus: DHCP and DNS for the guests on {self.bridge}",
            f"interface={self.bridge}", "bind-interfaces", "except-interface=lo",
            f"dhcp-range={self.gateway.ip},static,{self.gateway.netmask},{LEASE_SECONDS}",
            f"dhcp-hostsfile={self.hosts}", f"dhcp-leasefile={self.leases}",
            "dhcp-authoritative", f"dhcp-option=option:router,{self.gateway.ip}",
            f"pid-file={self.pid_file}", "user=nobody", "group=nogroup", ""])

    def ensure(self, nics: list[GuestNic]) -> None:
        """dnsmasq running with this configuration and answering exactly `nics`."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o755)
        _replace(self.hosts, "".join(f"{nic.mac},{nic.ip}\n" for nic in nics))
        conf = self.configuration()
        pid = self.pid()
        if pid is not None and self.conf.exists() and self.conf.read_text() == conf:
            os.kill(pid, signal.SIGHUP)  # rereads the hosts file
            return
        if pid is not None:
            self._stop(pid)
        _replace(self.conf, conf)
        self.leases.touch()
        run("dnsmasq", f"--conf-file={self.conf}")  # returns once the daemon serves
        log.info("dnsmasq started", bridge=self.bridge, pid=self.pid())

    def pid(self) -> int | None:
        """The running dnsmasq of this configuration file, or None."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ValueError):
            return None
        return pid if f"--conf-file={self.conf}".encode() in cmdline else None

    def _stop(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        while Path(f"/proc/{pid}").exists():
            if time.monotonic() > deadline:
                raise NetworkError(f"dnsmasq (pid {pid}) did not stop on SIGTERM")
            time.sleep(0.05)  # waiting for a process we signalled to exit

    def stop(self) -> None:
        """Stop this bridge's dnsmasq, if it runs."""
        pid = self.pid()
        if pid is not None:
            self._stop(pid)

    def lease_of(self, mac: str) -> Lease | None:
        return read_leases(self.leases).get(mac)

    def release(self, nic: GuestNic) -> None:
        """Give up the guest's lease, if it has one (dnsmasq forgets it and rewrites its file)."""
        lease = self.lease_of(nic.mac)
        if lease is None:
            return
        run("dhcp_release", self.bridge, lease.ip, lease.mac,
            *([lease.client_id] if lease.client_id else []))


def _replace(path: Path, content: str) -> None:
    """Write a file whole (readers never see half of it)."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(content)
    temporary.chmod(0o644)
    os.replace(temporary, path)
