"""More libvirt hosts on this one machine, for tests that migrate real guests between them.

libvirt refuses to migrate a guest to the host it runs on: the two hosts must differ in host
UUID, and each needs its own daemon, sockets, state and guest files at the same paths. So
each host here is a libvirtd in a mount and UTS namespace of its own (`unshare`): its own
`/run/libvirt`, `/var/lib/libvirt`, `/var/cache/libvirt`, `/var/log/libvirt` and
`/etc/libvirt` (a `libvirtd.conf` with its own `host_uuid`, listening on TCP, without auth,
on a loopback address of its own), its own `/run/virtbus` (guests' sockets and serial logs)
and its own copy of a directory the test names (the agents' disk directory), each
bind-mounted from the host's directory under /var/tmp, and its own host name. The network
is the machine's: the two libvirtds reach each other, and QEMU streams the guest, over
their loopback addresses. An agent of the host runs inside its namespaces (`enter`).

QEMU runs as root without cgroups or a security driver and writes its own logs (no
virtlogd): what a test host needs, nothing the machine's own libvirtd uses. Teardown
destroys every guest, stops the daemon, kills any QEMU it left (by its pid files) and
removes the directories; the mounts go with the namespace's last process.
"""

from __future__ import annotations

import contextlib
import os
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


@dataclass(frozen=True)
class LibvirtHost:
    name: str
    address: str
    base: Path
    daemon: subprocess.Popen[bytes]

    @property
    def uri(self) -> str:
        """Its libvirtd, from anywhere on the machine."""
        return f"qemu+tcp://{self.address}/system"

    def enter(self) -> list[str]:
        """The command prefix that runs a program inside this host's namespaces."""
        return ["nsenter", "-t", str(self.daemon.pid), "-m", "-u", "--"]

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
def libvirt_host(name: str, address: str, shared: Path) -> Iterator[LibvirtHost]:
    """A libvirt host named `name` answering on `address`, with its own copy of `shared`."""
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
    _configure(base, address)
    log = base / "libvirtd.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c",
             _script(base, name, shared)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PATH": os.environ.get(
                "PATH", "") + ":/usr/sbin:/sbin"})
    host = LibvirtHost(name, address, base, daemon)
    try:
        _answering(host.uri, daemon, log)
        yield host
    finally:
        _tear_down(host)
        shutil.rmtree(base, ignore_errors=True)
