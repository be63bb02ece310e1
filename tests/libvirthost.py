"""More libvirt hosts on this one machine, for tests that migrate real guests between them.

libvirt refuses to migrate a guest to the host it runs on: the two hosts must differ in host
UUID, and each needs its own daemon, sockets, state and guest files at the same paths. So
each host here is a libvirtd in a mount, UTS and network namespace of its own: its own
`/run/libvirt`, `/var/lib/libvirt`, `/var/cache/libvirt`, `/var/log/libvirt` and
`/etc/libvirt` (a `libvirtd.conf` with its own `host_uuid`, listening on TCP, without auth,
on its address), its own `/run/virtbus` (guests' sockets and serial logs) and its own copy
of a directory the test names (the agents' disk directory), each bind-mounted from the
host's directory under /var/tmp, and its own host name. An agent of the host runs inside its
namespaces (`enter`), so the bridge, taps, dnsmasq and NAT it makes for its guests are the
host's alone, as on two machines.

The network (`host_pair`): a veth pair joins the two hosts' namespaces directly, each end
with its host's address: the libvirtds reach each other, and QEMU streams the guest, over
it. Each namespace also has an uplink veth to the machine's namespace, routed to one address
there (`Uplink.address`, on a link of its own) where the test's NATS listens; nothing else of the
machine's network is reachable, and no packet crosses a bridge or the machine's forwarding
(whose firewall may drop it). The test reaches each libvirtd through its unix socket.

QEMU runs as root without cgroups or a security driver and writes its own logs (no
virtlogd): what a test host needs, nothing the machine's own libvirtd uses. Teardown
destroys every guest, stops the daemon, kills any QEMU it left (by its pid files) and every
process left in the host's network namespace (the agent's dnsmasq), and removes the
namespace (with it the veths and whatever the agent made in it) and the directories; the
mounts go with the namespace's last process.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import libvirt
import pytest

from nodeagent.converter import defaults as converter_defaults
from nodeagent.virterror import quiet_libvirt_errors

START_SECONDS = 60.0
"""A deadline for libvirtd to answer, not a measure: it starts in a second or two."""
BOUND = {  # the host's own directory (under its base) for each path the host sees
    "run-libvirt": "/run/libvirt",
    "lib-libvirt": "/var/lib/libvirt",
    "cache-libvirt": "/var/cache/libvirt",
    "log-libvirt": "/var/log/libvirt",
    "etc-libvirt": "/etc/libvirt",
    "run-virtbus": os.path.realpath(converter_defaults.RUN_DIR),
}


UPLINK_SPACE = ipaddress.IPv4Network("10.192.0.0/10")
"""Where an uplink's /24 is picked (one the machine routes nowhere yet)."""
PAIR_PREFIX = 29
"""The host pair's link: its first addresses (.2, .3), clear of the uplinks' /30s above."""


@dataclass(frozen=True)
class HostNetwork:
    netns: str
    address: str
    """On the link between the pair: where its libvirtd and QEMU take migrations in."""


@dataclass(frozen=True)
class LibvirtHost:
    name: str
    address: str
    base: Path
    daemon: subprocess.Popen[bytes]
    netns: str

    @property
    def uri(self) -> str:
        """Its libvirtd, from the machine's namespaces (its socket is under `base`)."""
        return f"qemu+unix:///system?socket={self.base / 'run-libvirt' / 'libvirt-sock'}"

    def enter(self) -> list[str]:
        """The command prefix that runs a program inside this host's namespaces."""
        return ["nsenter", "-t", str(self.daemon.pid), "-m", "-u", "-n", "--"]

    def ip(self, *args: str) -> str:
        """`ip` in this host's network namespace; its output."""
        return _ip("-n", self.netns, *args)

    def run_dir(self, namespace: str, name: str) -> Path:
        """What this host has at `RUN_DIR/<namespace>/<name>` (a guest's sockets, its log)."""
        return self.base / "run-virtbus" / namespace / name


def _configure(base: Path, address: str) -> None:
    etc = base / "etc-libvirt"
    (etc / "libvirtd.conf").write_text(
        f'host_uuid = "{uuid.uuid4()}"\nlisten_tls = 0\nlisten_tcp = 1\n'
        f'listen_addr = "{address}"\nauth_tcp = "none"\nauth_unix_rw = "none"\n')
    (etc / "qemu.conf").write_text(
        'stdio_handler = "file"\ncgroup_controllers = [ ]\nsecurity_driver = "none"\n'
        f'user = "root"\ngroup = "root"\nmigration_address = "{address}"\n')


def _script(base: Path, name: str, shared: Path) -> str:
    binds = [f"mount --bind {base / own} {seen}" for own, seen in BOUND.items()]
    binds.append(f"mount --bind {base / 'shared'} {shared}")
    return "set -e\n" + "\n".join(binds) + (
        f"\nhostname {name}\nexec libvirtd --listen -p {base / 'libvirtd.pid'}\n")


def _answering(uri: str, daemon: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while True:
        if daemon.poll() is not None:
            pytest.fail(f"libvirtd exited {daemon.returncode}:\n{log.read_text()}")
        try:
            libvirt.open(uri).close()
            return
        except libvirt.libvirtError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)  # retry backoff while libvirtd starts


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def _routed() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the machine's namespace routes or holds an address of."""
    found = []
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all")):
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                found.append(ipaddress.IPv4Network(dst, strict=False))
    return found


@dataclass(frozen=True)
class Uplink:
    """The machine's end of the hosts' uplinks: `address` (a /32 on a link of its own), and
    the /24 their /30s come from."""

    link: str
    network: ipaddress.IPv4Network

    @property
    def address(self) -> str:
        return str(self.network.network_address + 1)


@contextlib.contextmanager
def uplink() -> Iterator[Uplink]:
    """An address on the machine for the hosts' namespaces to reach (the test's NATS)."""
    taken = _routed()
    free = [n for n in UPLINK_SPACE.subnets(new_prefix=24)
            if not any(n.overlaps(t) for t in taken)]
    network = random.choice(free)
    link = f"vbu{uuid.uuid4().hex[:8]}"
    up = Uplink(link, network)
    _ip("link", "add", link, "type", "bridge")  # one without ports: as a dummy link, which
    # a container's kernel may lack
    try:
        _ip("addr", "add", f"{up.address}/32", "dev", link)
        _ip("link", "set", link, "up")
        yield up
    finally:
        _ip("link", "del", link)


@contextlib.contextmanager
def host_pair(up: Uplink, names: tuple[str, str]) -> Iterator[dict[str, HostNetwork]]:
    """A network namespace for each of two hosts: joined by a veth pair, each with an uplink
    routed to `up.address` (module docstring). Removed after, with all in them."""
    tag = uuid.uuid4().hex[:6]
    spaces = {name: f"virtbus-{tag}-{index}" for index, name in enumerate(names)}
    pair = ipaddress.IPv4Network(f"{up.network.network_address}/{PAIR_PREFIX}")
    made: list[str] = []
    try:
        for index, netns in enumerate(spaces.values()):
            _ip("netns", "add", netns)
            made.append(netns)
            _ip("-n", netns, "link", "set", "lo", "up")
            outside, inside = (up.network.network_address + 8 + 4 * index + k for k in (1, 2))
            machine_end = f"vb{tag}u{index}"
            _ip("link", "add", machine_end, "type", "veth", "peer", "name", "uplink", "netns",
                netns)
            _ip("addr", "add", f"{outside}/30", "dev", machine_end)
            _ip("link", "set", machine_end, "up")
            _ip("-n", netns, "addr", "add", f"{inside}/30", "dev", "uplink")
            _ip("-n", netns, "link", "set", "uplink", "up")
            _ip("-n", netns, "route", "add", f"{up.address}/32", "via", str(outside))
        first, second = spaces.values()
        _ip("-n", first, "link", "add", "pair", "type", "veth", "peer", "name", "pair",
            "netns", second)
        networks = {}
        for index, (name, netns) in enumerate(spaces.items()):
            address = str(pair.network_address + 2 + index)
            _ip("-n", netns, "addr", "add", f"{address}/{PAIR_PREFIX}", "dev", "pair")
            _ip("-n", netns, "link", "set", "pair", "up")
            networks[name] = HostNetwork(netns, address)
        yield networks
    finally:
        for netns in made:
            _empty(netns)
            _ip("netns", "del", netns)
        for index in range(len(made)):  # gone with its namespace's end, unless it lingers
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("link", "del", f"vb{tag}u{index}")


def _empty(netns: str) -> None:
    """Kill what the test left running in the namespace (an agent's dnsmasq): the namespace
    goes with its last process."""
    for pid in (int(p) for p in _ip("netns", "pids", netns).split()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _tear_down(host: LibvirtHost) -> None:
    with contextlib.suppress(libvirt.libvirtError):
        conn = libvirt.open(host.uri)
        for dom in conn.listAllDomains(0):
            with contextlib.suppress(libvirt.libvirtError):
                dom.destroy()
            with contextlib.suppress(libvirt.libvirtError):
                dom.undefine()
        conn.close()
    host.daemon.terminate()
    try:
        host.daemon.wait(timeout=20)
    except subprocess.TimeoutExpired:
        host.daemon.kill()
        host.daemon.wait()
    for pidfile in (host.base / "run-libvirt" / "qemu").glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):  # gone already
            os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)


@contextlib.contextmanager
def libvirt_host(name: str, network: HostNetwork, shared: Path) -> Iterator[LibvirtHost]:
    """A libvirt host named `name` in `network`'s namespace, answering on its address, with
    its own copy of `shared`."""
    libvirtd = shutil.which("libvirtd") or shutil.which("libvirtd", path="/usr/sbin")
    if libvirtd is None or shutil.which("nsenter") is None:
        pytest.fail("libvirtd or nsenter is not installed: apt-get install "
                    "libvirt-daemon-system util-linux (./dev test installs it)", pytrace=False)
    quiet_libvirt_errors()
    base = Path(tempfile.mkdtemp(prefix=f"virtbus-{name}-", dir="/var/tmp"))
    base.chmod(0o755)
    for own, seen in BOUND.items():
        (base / own).mkdir()
        Path(seen).mkdir(parents=True, exist_ok=True)  # a mount point; the machine's stays
    (base / "shared").mkdir()
    shared.mkdir(parents=True, exist_ok=True)
    _configure(base, network.address)
    log = base / "libvirtd.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            ["ip", "netns", "exec", network.netns,  # there with its own /sys
             "unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c",
             _script(base, name, shared)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PATH": os.environ.get(
                "PATH", "") + ":/usr/sbin:/sbin"})
    host = LibvirtHost(name, network.address, base, daemon, network.netns)
    try:
        _answering(host.uri, daemon, log)
        yield host
    finally:
        _tear_down(host)
        shutil.rmtree(base, ignore_errors=True)
