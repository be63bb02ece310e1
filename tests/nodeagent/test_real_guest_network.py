"""Real guests on the node's network: a real agent on `qemu:///system`, its bridge, taps,
dnsmasq and nftables, and busybox guests that ask for their address over DHCP.

Two guests run at once: one with KubeVirt's masquerade binding, one with the bridge binding.
Each guest's init loads virtio-net (a module of the cloud kernel), runs `udhcpc` on eth0,
prints the address it was given on its serial console and pings its gateway (the node's
bridge). The test checks that the address the agent reports for the VMI, and the control
plane shows in `status.interfaces`, is the one the guest printed; that the node reaches the
guest; that only the masquerade guest's address is NATed; and that each guest's tap, dnsmasq
entry, lease and NAT go with its VMI (the NAT table with the last masquerade guest). Then an
agent restart: the guest still running keeps its network; one removed while the agent was
down loses its tap, entry and NAT.

What it needs (QEMU, libvirt, a kernel, busybox-static, dnsmasq, nftables) `./dev test`
installs; a host without it fails with what to install, never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import libvirt
import msgspec
import pytest
from nats.js.api import ConsumerConfig
from nats.js.client import JetStreamContext

from controlplane.intake import report_command
from events.api.vm import INFO_SOURCE_DOMAIN
from events.language.messages import NodeCommand, NodeReport, node_actor
from events.language.query import Query, ask
from nodeagent.converter import defaults as converter_defaults
from nodeagent.converter.console import SERIAL_LOG
from nodeagent.imagestore import ImageStore
from nodeagent.network import links, masquerade
from nodeagent.network.dhcp import Dnsmasq, read_leases
from nodeagent.network.nics import tap_name
from tests.nodeagent.helpers import Cluster, Running, start
from tests.nodeagent.test_work import publish
from tests.realhost import DHCP_EVENT, URI, busybox_initramfs, host_kernel, libvirtd, require  # noqa: F401 (libvirtd: a fixture)

DEADLINE_SECONDS = 90.0
"""A deadline, not a measure: two guests under TCG on a loaded machine lease in some 10 s."""
BOOT_IMAGE = "virtbus.test/netboot:1"
MODULES = [  # in load order: virtio-pci, then virtio-net and what it needs
    "drivers/virtio/virtio_ring.ko", "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_pci_legacy_dev.ko", "drivers/virtio/virtio_pci_modern_dev.ko",
    "drivers/virtio/virtio_pci.ko", "net/core/failover.ko", "drivers/net/net_failover.ko",
    "drivers/net/virtio_net.ko"]
INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for module in /modules/*.ko; do insmod "$module"; done
echo "virtbus-guest: init started"
ip link set lo up
ip link set eth0 up
if udhcpc -i eth0 -s /bin/dhcp-event -t 30 -T 2 -n -q; then
    echo "virtbus-guest: address $(cat /tmp/ip) gateway $(cat /tmp/router)"
    if ping -c 1 -W 10 "$(cat /tmp/router)" >/dev/null; then
        echo "virtbus-guest: gateway answers"
    else
        echo "virtbus-guest: gateway silent"
    fi
else
    echo "virtbus-guest: no DHCP lease"
fi
echo "virtbus-guest: ready"
while true; do sleep 3600; done
"""
ADDRESS_LINE = re.compile(r"virtbus-guest: address (\S+) gateway (\S+)\r?\n")
"""A whole line: the console log is read while the guest writes it, and a line half
written would give half an address."""


@pytest.fixture(scope="module")
def net_guest_files() -> Iterator[Path]:
    """A directory the qemu user can read, with the kernel and the DHCP guest's initramfs."""
    kernel, _ = host_kernel()
    base = Path(tempfile.mkdtemp(prefix="virtbus-net-guest-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        busybox_initramfs(base / "initrd.img", INIT, MODULES, {"bin/dhcp-event": DHCP_EVENT})
        shutil.copy(kernel, base / "vmlinuz")
        yield base
    finally:
        shutil.rmtree(base)


class Host:
    """The agent's host: its directories, bridge and subnet, unique to the test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bridge = f"vbt{uuid.uuid4().hex[:8]}"
        self.subnet = f"10.{77 + uuid.uuid4().int % 100}.{uuid.uuid4().int % 250}.0/24"
        self.network_dir = root / "network"
        self.dhcp = Dnsmasq(self.network_dir / self.bridge, self.bridge,
                            _gateway(self.subnet))

    def options(self) -> dict[str, Any]:
        return {"libvirt_uri": URI, "disk_dir": str(self.root / "disks"),
                "image_dir": str(self.root / "images"), "bridge": self.bridge,
                "pod_subnet": self.subnet, "network_dir": str(self.network_dir)}

    def hosts_entries(self) -> str:
        return self.dhcp.hosts.read_text() if self.dhcp.hosts.exists() else ""

    def agent_args(self) -> list[str]:
        """The agent's command-line options for this network."""
        return ["--bridge", self.bridge, "--pod-subnet", self.subnet,
                "--network-dir", str(self.network_dir)]

    def tear_down(self) -> None:
        """What the agent's network left on the host, removed by hand (the code may be
        wrong): dnsmasq, the taps, the bridge, the NAT table."""
        self.dhcp.stop()
        for tap in links.taps_on(self.bridge):
            links.delete(tap)
        links.delete(self.bridge)
        table = f"ip {masquerade.table_name(self.bridge)}"
        subprocess.run(["nft", "-f", "-"], input=f"add table {table}\ndelete table {table}\n",
                       text=True, check=True)


def _gateway(subnet: str) -> ipaddress.IPv4Interface:
    network = ipaddress.IPv4Network(subnet)
    return ipaddress.IPv4Interface(f"{next(network.hosts())}/{network.prefixlen}")


@pytest.fixture
async def net_host(libvirtd: None, net_guest_files: Path,  # noqa: F811 (the fixture)
                   cluster: Cluster) -> AsyncIterator[Host]:
    for program, package in (("dnsmasq", "dnsmasq-base"), ("dhcp_release", "dnsmasq-utils"),
                             ("nft", "nftables")):
        require(program, package)
    root = Path(tempfile.mkdtemp(prefix="virtbus-nethost-", dir="/var/tmp"))
    root.chmod(0o755)
    host = Host(root)
    store = ImageStore(str(root / "images"))
    store.import_file(BOOT_IMAGE, str(net_guest_files / "vmlinuz"), "/boot/vmlinuz")
    store.import_file(BOOT_IMAGE, str(net_guest_files / "initrd.img"), "/boot/initrd.img")
    try:
        yield host
    finally:
        conn = libvirt.open(URI)
        for dom in conn.listAllDomains(0):  # what a failed test left
            if dom.name().startswith(f"{cluster.namespace}_"):
                with contextlib.suppress(libvirt.libvirtError):
                    dom.destroy()
                with contextlib.suppress(libvirt.libvirtError):
                    dom.undefine()
        conn.close()
        host.tear_down()
        shutil.rmtree(root)
        shutil.rmtree(Path(converter_defaults.RUN_DIR, cluster.namespace), ignore_errors=True)


def _spec(binding: str) -> dict[str, Any]:
    return {
        "domain": {
            "firmware": {"kernelBoot": {
                "kernelArgs": "console=ttyS0 panic=-1 quiet",
                "container": {"image": BOOT_IMAGE, "kernelPath": "/boot/vmlinuz",
                              "initrdPath": "/boot/initrd.img"}}},
            "devices": {"interfaces": [{"name": "default", binding: {}}]},
            "resources": {"requests": {"memory": "256Mi"}},
        },
        "networks": [{"name": "default", "pod": {}}],
    }


async def _until(what: str, check: Callable[[], Any], running: Running,
                 context: Callable[[], str] = str) -> Any:
    """`check()`'s first truthy answer, polled until the deadline (the agent must live);
    else a failure that says what, and `context()`."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        assert not running.task.done(), "the agent ended"
        if found := check():
            return found
        await asyncio.sleep(0.1)  # poll interval of host state and console logs
    raise AssertionError(f"not within {DEADLINE_SECONDS} s: {what}\n{context()}")


def _console(name: str, namespace: str) -> str:
    log = Path(converter_defaults.RUN_DIR, namespace, name, SERIAL_LOG)
    return log.read_text(errors="replace") if log.exists() else ""


async def _guest_address(name: str, namespace: str, running: Running) -> tuple[str, str]:
    """The address and gateway the guest printed once it had its lease."""
    def printed() -> re.Match[str] | None:
        console = _console(name, namespace)
        assert "no DHCP lease" not in console, console
        return ADDRESS_LINE.search(console)
    found = await _until(f"{name} prints its DHCP address", printed, running,
                         lambda: _console(name, namespace))
    return found.group(1), found.group(2)


class Reports:
    """The agent's reports, each interfaces report folded by the control plane as its report
    intake folds it (`report_command`, the writer)."""

    def __init__(self, cluster: Cluster, sub: JetStreamContext.PullSubscription) -> None:
        self.cluster, self.sub = cluster, sub
        self.seen: list[NodeReport] = []

    async def fold(self) -> None:
        try:
            msgs = await self.sub.fetch(16, timeout=0.5)
        except TimeoutError:
            return
        for msg in msgs:
            await msg.ack()
            report = msgspec.msgpack.decode(msg.data, type=NodeReport)
            self.seen.append(report)
            command = report_command(report)
            if command is not None:
                await self.cluster.writer.execute(command)

    async def wait(self, what: str, match: Callable[[NodeReport], bool],
                   running: Running) -> NodeReport:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            assert not running.task.done(), "the agent ended"
            for report in self.seen:
                if match(report):
                    return report
            await self.fold()
        raise AssertionError(f"no report within {DEADLINE_SECONDS} s: {what}")


async def _reports(cluster: Cluster) -> Reports:
    sub = await cluster.nc.jetstream().pull_subscribe(
        cluster.layout.reports_filter, stream=cluster.layout.reports_stream,
        config=ConsumerConfig(inactive_threshold=3 * DEADLINE_SECONDS))
    return Reports(cluster, sub)


def _leased(name: str, ip: str) -> Callable[[NodeReport], bool]:
    return lambda r: (r.interfaces is not None and r.interfaces.name == name
                      and [i.ip_address for i in r.interfaces.interfaces] == [ip])


def _phase(name: str, phase: str) -> Callable[[NodeReport], bool]:
    return lambda r: r.domain is not None and (r.domain.name, r.domain.phase) == (name, phase)


async def _vmi_status(cluster: Cluster, name: str) -> dict[str, Any]:
    info = await cluster.nc.jetstream().stream_info(cluster.layout.events_stream)
    answer = await ask(cluster.nc, cluster.layout,
                       Query(kind="VirtualMachineInstance", namespace=cluster.namespace,
                             name=name, after=info.state.last_seq), node_actor(cluster.node))
    assert not answer.error, answer.error
    status: dict[str, Any] = answer.items[0]["status"]
    return status


def _ping(ip: str) -> bool:
    """The node reaches `ip` (busybox's ping: the host may have no other)."""
    return subprocess.run(["busybox", "ping", "-c", "1", "-W", "10", ip], capture_output=True,
                          check=False).returncode == 0


def _stop(ref: Any) -> NodeCommand:
    return NodeCommand(event_id=str(uuid.uuid4()), verb="stop", namespace=ref.namespace,
                       name=ref.name, uid=ref.uid, grace_period_seconds=0)


async def test_guests_lease_their_address_are_reached_and_leave_nothing_behind(
        cluster: Cluster, net_host: Host, nats_url: str) -> None:
    running = await start(cluster, nats_url, **net_host.options())
    try:
        reports = await _reports(cluster)
        nat = await cluster.placed("nat", _spec("masquerade"))
        bridged = await cluster.placed("bridged", _spec("bridge"))
        for ref, binding in ((nat, "masquerade"), (bridged, "bridge")):
            await publish(cluster, cluster.launch(ref, _spec(binding)))
        for ref in (nat, bridged):
            await reports.wait(f"{ref.name} Running", _phase(ref.name, "Running"), running)

        addresses = {}
        for ref in (nat, bridged):
            ip, gateway = await _guest_address(ref.name, ref.namespace, running)
            assert gateway == str(_gateway(net_host.subnet).ip)
            report = await reports.wait(f"{ref.name}'s address reported", _leased(ref.name, ip),
                                        running)
            assert report.interfaces is not None
            reported = report.interfaces.interfaces[0]
            status = await _vmi_status(cluster, ref.name)
            assert status["interfaces"] == [{
                "name": "default", "mac": reported.mac, "ipAddress": ip, "ipAddresses": [ip],
                "infoSource": INFO_SOURCE_DOMAIN}]
            assert f"{reported.mac},{ip}" in net_host.hosts_entries()
            assert links.taps_on(net_host.bridge)[tap_name(ref.uid, 0)] == ref.uid
            await _until(f"{ref.name} pings its gateway",
                         lambda n=ref.name, ns=ref.namespace: "gateway answers" in _console(n, ns),
                         running)
            assert _ping(ip), f"the node does not reach {ref.name} at {ip}"
            addresses[ref.name] = (ip, reported.mac)
        assert addresses["nat"][0] != addresses["bridged"][0]
        assert masquerade.masqueraded(net_host.bridge) == [addresses["nat"][0]]

        await publish(cluster, _stop(nat))
        await reports.wait("nat stopped", _phase("nat", "Succeeded"), running)
        nat_mac = addresses["nat"][1]
        assert tap_name(nat.uid, 0) not in links.taps_on(net_host.bridge)
        assert nat_mac not in net_host.hosts_entries()
        assert masquerade.masqueraded(net_host.bridge) == [], "no masquerade guest is left"
        await _until("nat's lease released",
                     lambda: nat_mac not in read_leases(net_host.dhcp.leases), running)
        assert tap_name(bridged.uid, 0) in links.taps_on(net_host.bridge)
    finally:
        await running.close()

    # The agent is down; the bridged guest is removed meanwhile; a tap nobody owns appears.
    conn = libvirt.open(URI)
    dom = conn.lookupByName(bridged.domain)
    dom.destroy()
    dom.undefine()
    conn.close()
    stray = f"vbs{uuid.uuid4().hex[:8]}"
    links.ensure_tap(stray, net_host.bridge, "no-such-vmi")
    bridged_mac = addresses["bridged"][1]
    assert bridged_mac in read_leases(net_host.dhcp.leases)

    again = await start(cluster, nats_url, **net_host.options())
    try:
        assert links.taps_on(net_host.bridge) == {}, "stale taps stay after a restart"
        assert bridged_mac not in net_host.hosts_entries()
        await _until("the removed guest's lease released",
                     lambda: bridged_mac not in read_leases(net_host.dhcp.leases), again)
    finally:
        await again.close()


async def test_a_guest_kept_across_an_agent_restart_keeps_its_network(
        cluster: Cluster, net_host: Host, nats_url: str) -> None:
    running = await start(cluster, nats_url, **net_host.options())
    reports = await _reports(cluster)
    try:
        ref = await cluster.placed("kept", _spec("masquerade"))
        await publish(cluster, cluster.launch(ref, _spec("masquerade")))
        ip, _ = await _guest_address(ref.name, ref.namespace, running)
        await reports.wait("kept's address", _leased(ref.name, ip), running)
    finally:
        await running.close()
    tap = tap_name(ref.uid, 0)

    again = await start(cluster, nats_url, **net_host.options())
    try:
        assert links.taps_on(net_host.bridge) == {tap: ref.uid}
        assert masquerade.masqueraded(net_host.bridge) == [ip]
        assert ip in net_host.hosts_entries()
        reports.seen.clear()
        await reports.wait("kept's address, reported again", _leased(ref.name, ip), again)
        assert _ping(ip)
        await publish(cluster, _stop(ref))
        await reports.wait("kept stopped", _phase(ref.name, "Succeeded"), again)
        assert links.taps_on(net_host.bridge) == {}
        assert masquerade.masqueraded(net_host.bridge) == []
    finally:
        await again.close()


async def test_an_interface_the_node_cannot_give_fails_the_launch_and_makes_nothing(
        cluster: Cluster, net_host: Host, nats_url: str) -> None:
    running = await start(cluster, nats_url, **net_host.options())
    try:
        reports = await _reports(cluster)
        spec = _spec("masquerade")
        spec["networks"] = [{"name": "default", "multus": {"networkName": "fast"}}]
        ref = await cluster.placed("multus", spec)
        await publish(cluster, cluster.launch(ref, spec))
        failed = await reports.wait("multus failed", _phase(ref.name, "Failed"), running)
        assert failed.domain is not None
        assert failed.domain.reason == (
            "launch failed: spec.networks[0]: this node has only the pod network")
        assert ref.domain not in {d.name for d in running.agent.guests.summaries()}
        assert links.taps_on(net_host.bridge) == {}
        assert not (net_host.network_dir / net_host.bridge / "nics.json").exists()
    finally:
        await running.close()
