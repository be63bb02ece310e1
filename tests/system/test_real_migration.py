"""Live migration of a real guest, through the whole system: control plane, read service and
two real agents, each on a libvirt host of its own (`tests.libvirthost`: two libvirtds on
this machine, each in namespaces of its own, network included, with its own guest files,
joined by a veth pair). libvirt migrates the guest (`migrateToURI3`, peer to peer, its
containerDisk copied with it) from one host to the other, the agents report, and the log
moves the VMI. The test's NATS listens on the one address of the machine both hosts reach.

The guest is the host's kernel with a busybox init that writes a token (from its kernel
command line) into its containerDisk, takes its address by DHCP when it has a network
interface, then prints a counter and what its disk holds there, every second, on the serial
console, which each host logs in its own directory. So a test sees which host runs it, that
it kept counting across the move (the same guest, not booted again), and that its disk came
along. A VM with KubeVirt's default pod interface has its tap on the bridge of the host
that runs it, and on no other.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libvirt
import pytest

from controlplane.user.client import Client
from events.jetstream.server import EmbeddedNats
from nodeagent.converter.console import SERIAL_LOG
from nodeagent.defaults import BRIDGE, SOURCE_RESTARTED_REASON
from nodeagent.imagestore import ImageStore
from nodeagent.migrating import ABORTED_REASON
from nodeagent.migration import COMPLETION_TIMEOUT
from nodeagent.network.links import TAP_ALIAS_PREFIX
from nodeagent.network.nics import derived_mac, tap_name
from tests.libvirthost import LibvirtHost, Uplink, host_pair, libvirt_host, uplink
from tests.realhost import DHCP_EVENT, QEMU, QEMU_IMG, busybox_initramfs, host_kernel, require
from tests.system.harness import System, eventually
from tests.system.test_guests import virtbus
from tests.system.test_migration import migration, migration_config, running_on

pytestmark = pytest.mark.timeout(600)  # guests booted under TCG on a loaded 2-core machine

BOOT_SECONDS = 180.0
"""Deadlines, not measures: the guest counts within some 10 s of its start under TCG."""
MIGRATE_SECONDS = 180.0
NODE_GRACE_SECONDS = 30.0
"""An agent killed and started again must be back within the grace, even on a loaded
machine: its node going NotReady would fail the migration for that reason instead."""
BOOT_IMAGE = "virtbus.test/boot:1"
DISK_IMAGE = "virtbus.test/disk:1"
TOKEN_OFFSET_BLOCKS = 2048
"""Where in its disk the guest writes its token: 1 MiB in, in 512-byte blocks."""
MODULES = ["drivers/virtio/virtio_ring.ko", "drivers/virtio/virtio.ko",
           "drivers/virtio/virtio_pci_legacy_dev.ko", "drivers/virtio/virtio_pci_modern_dev.ko",
           "drivers/virtio/virtio_pci.ko", "drivers/block/virtio_blk.ko",
           "net/core/failover.ko", "drivers/net/net_failover.ko", "drivers/net/virtio_net.ko"]
INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for module in /modules/*.ko; do insmod "$module"; done
token=$(sed -n 's/.*virtbus.token=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
printf '%s' "$token" | dd of=/dev/vda bs=512 seek={TOKEN_OFFSET_BLOCKS} conv=notrunc,fsync \\
    2>/dev/null
if [ -e /sys/class/net/eth0 ]; then  # on the pod network: its address by DHCP
    ip link set lo up
    ip link set eth0 up
    if udhcpc -i eth0 -s /bin/dhcp-event -t 30 -T 2 -n -q; then
        echo "virtbus-guest: address $(cat /tmp/ip)"
    else
        echo "virtbus-guest: no DHCP lease"
    fi
fi
i=0
while true; do
    echo 3 > /proc/sys/vm/drop_caches
    disk=$(dd if=/dev/vda bs=512 skip={TOKEN_OFFSET_BLOCKS} count=1 2>/dev/null \\
           | head -c ${{#token}})
    echo "virtbus-guest: tick $i disk $disk"
    i=$((i + 1))
    sleep 1
done
"""
TICK = re.compile(r"virtbus-guest: tick (\d+) disk (\S*)\r?\n")
ADDRESS = re.compile(r"virtbus-guest: address (\S+)\r?\n")
"""Whole lines: the console log is read while the guest writes it."""


@dataclass(frozen=True)
class Tick:
    number: int
    disk: str


@pytest.fixture(scope="module")
def guest_files() -> Iterator[Path]:
    require(QEMU, "qemu-system-x86")
    require(QEMU_IMG, "qemu-utils")
    base = Path(tempfile.mkdtemp(prefix="virtbus-migrating-guest-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        busybox_initramfs(base / "initrd.img", INIT, MODULES, {"bin/dhcp-event": DHCP_EVENT})
        shutil.copy(host_kernel()[0], base / "vmlinuz")
        subprocess.run([QEMU_IMG, "create", "-q", "-f", "raw", str(base / "disk.raw"), "2M"],
                       check=True)
        yield base
    finally:
        shutil.rmtree(base)


@pytest.fixture(scope="module")
def machine_end() -> Iterator[Uplink]:
    with uplink() as up:
        yield up


@pytest.fixture(scope="module")
def nats_url(machine_end: Uplink) -> Iterator[str]:
    """This module's NATS, where the hosts' agents reach it (`tests.libvirthost`)."""
    data = Path(tempfile.mkdtemp(prefix="virtbus-nats-"))
    server = EmbeddedNats(data, host=machine_end.address).start()
    try:
        yield server.url
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def hosts(tmp_path: Path, machine_end: Uplink) -> Iterator[dict[str, LibvirtHost]]:
    """node-1 and node-2: two libvirt hosts, each in a network namespace of its own, joined
    by a veth pair, each with its own copy of the agents' disk directory."""
    disks = tmp_path / "disks"
    with host_pair(machine_end, ("node-1", "node-2")) as nets, \
            libvirt_host("node-1", nets["node-1"], disks) as one, \
            libvirt_host("node-2", nets["node-2"], disks) as two:
        yield {"node-1": one, "node-2": two}


@pytest.fixture
def system(nats_url: str, prefix: str, tmp_path: Path, hosts: dict[str, LibvirtHost],
           guest_files: Path) -> Iterator[System]:
    """The system, its agents on `qemu:///system` inside their hosts, taking migrations in
    on their hosts' addresses."""
    store = ImageStore(str(tmp_path / "images"))
    store.import_file(DISK_IMAGE, str(guest_files / "disk.raw"))
    store.import_file(BOOT_IMAGE, str(guest_files / "vmlinuz"), "/boot/vmlinuz")
    store.import_file(BOOT_IMAGE, str(guest_files / "initrd.img"), "/boot/initrd.img")
    sys_ = System(nats_url, prefix, tmp_path, nodes=2, libvirt_uri="qemu:///system",
                  node_grace=NODE_GRACE_SECONDS)
    for node, host in hosts.items():
        sys_.args[node] += ["--image-dir", store.root, "--hypervisor", "qemu",
                            "--migration-address", host.address,
                            "--migration-report-interval", "0.2",
                            "--network-dir", str(host.base / "network")]
        sys_.entered[node] = host.enter()
    try:
        sys_.start_all()
        yield sys_
    finally:
        sys_.stop_all()


def vm(name: str, token: str, *, pod_network: bool = False) -> dict[str, Any]:
    """The guest's VM; `pod_network`: with KubeVirt's default pod interface, else none."""
    devices: dict[str, Any] = {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}
    if not pod_network:
        devices["autoattachPodInterface"] = False
    return {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "domain": {
                "firmware": {"kernelBoot": {
                    "kernelArgs": f"console=ttyS0 panic=-1 quiet virtbus.token={token}",
                    "container": {"image": BOOT_IMAGE, "kernelPath": "/boot/vmlinuz",
                                  "initrdPath": "/boot/initrd.img"}}},
                "devices": devices,
                "resources": {"requests": {"memory": "128Mi"}}},
            "volumes": [{"name": "root", "containerDisk": {"image": DISK_IMAGE}}]}}},
    }


def serial(host: LibvirtHost, name: str) -> str:
    """What the guest printed on `host`'s serial console log."""
    log = host.run_dir("default", name) / SERIAL_LOG
    return log.read_text(errors="replace") if log.exists() else ""


def ticks(host: LibvirtHost, name: str) -> list[Tick]:
    return [Tick(int(m[1]), m[2]) for m in TICK.finditer(serial(host, name))]


def taps(host: LibvirtHost) -> dict[str, str]:
    """The taps on the agent's bridge in `host`'s network namespace, each with the VMI uid
    its alias names."""
    if BRIDGE not in {link["ifname"] for link in json.loads(host.ip("-j", "link", "show"))}:
        return {}
    return {str(link["ifname"]): str(link.get("ifalias", "")).removeprefix(TAP_ALIAS_PREFIX)
            for link in json.loads(host.ip("-j", "-d", "link", "show", "master", BRIDGE))
            if link.get("linkinfo", {}).get("info_kind") == "tun"}


def nics(host: LibvirtHost, domain: str) -> set[tuple[str, str]]:
    """The tap and MAC of each interface of `domain` as `host`'s libvirtd runs it."""
    conn = libvirt.open(host.uri)
    try:
        root = ET.fromstring(conn.lookupByName(domain).XMLDesc(0))
    finally:
        conn.close()
    return {(target.get("dev", ""), mac.get("address", ""))
            for i in root.iterfind("devices/interface")
            if (target := i.find("target")) is not None and (mac := i.find("mac")) is not None}


async def ticking(host: LibvirtHost, name: str, past: int,
                  timeout: float = BOOT_SECONDS) -> Tick:
    """The first tick on `host` numbered above `past`, once the guest printed it there."""
    async def probe() -> Tick | None:
        return next((t for t in ticks(host, name) if t.number > past), None)

    return await eventually(probe, timeout=timeout, what=f"{name} counting past {past} on "
                                                         f"{host.name}")


def guests(host: LibvirtHost) -> dict[str, int]:
    """Domain name to state, as the host's libvirtd lists them."""
    conn = libvirt.open(host.uri)
    try:
        return {dom.name(): dom.state()[0] for dom in conn.listAllDomains(0)}
    finally:
        conn.close()


async def runs_only_on(hosts: dict[str, LibvirtHost], node: str, name: str) -> bool:
    """The guest runs on `node`'s host, and no other host has a domain of it."""
    seen = {n: await asyncio.to_thread(guests, h) for n, h in hosts.items()}
    domain = f"default_{name}"
    return seen[node].get(domain) == libvirt.VIR_DOMAIN_RUNNING and all(
        domain not in found for n, found in seen.items() if n != node)


async def test_a_real_guest_migrates_live_with_its_disk(
        system: System, vb: Client, hosts: dict[str, LibvirtHost]) -> None:
    token = uuid.uuid4().hex[:12]
    await vb.apply(vm("web", token))
    source, uid = await running_on(vb, "web")
    target = next(n for n in hosts if n != source)
    before = await ticking(hosts[source], "web", past=0)
    assert before.disk == token

    moved = await virtbus(system, "migrate", "web")
    assert (moved.code, moved.out.strip()) == (0, "VM web was scheduled to migrate"), moved.err
    done = await eventually(lambda: migration(vb, "web", "Succeeded"), timeout=MIGRATE_SECONDS,
                            what="the migration Succeeded")
    state = done["status"]["migrationState"]
    assert (state["targetNode"], state["targetNodeAddress"]) == (target, hosts[target].address)
    assert done["status"]["progress"]["dataTotalBytes"] > 0
    vmi = await vb.get("VirtualMachineInstance", "default", "web")
    assert (vmi["metadata"]["uid"], vmi["status"]["nodeName"]) == (uid, target)

    await eventually(lambda: runs_only_on(hosts, target, "web"), timeout=MIGRATE_SECONDS,
                     what="the guest on its target only")
    arrived = await ticking(hosts[target], "web", past=0)
    assert ticks(hosts[target], "web")[0].number > before.number, \
        "the guest went on counting: moved, not booted again"
    assert arrived.disk == token, "its disk came along"
    later = await ticking(hosts[target], "web", past=arrived.number)
    assert later.disk == token
    await eventually(lambda: _gone(hosts[source].run_dir("default", "web")),
                     timeout=MIGRATE_SECONDS, what="the source's copy of the guest removed")


async def test_a_real_guest_on_the_pod_network_migrates_with_its_tap(
        system: System, vb: Client, hosts: dict[str, LibvirtHost]) -> None:
    """KubeVirt's default pod interface: the target attaches the guest's network as a launch
    would (the tap and MAC its domain names), so QEMU there opens its tap; the guest goes on
    counting there, and the source's tap goes with its copy."""
    token = uuid.uuid4().hex[:12]
    await vb.apply(vm("net", token, pod_network=True))
    source, uid = await running_on(vb, "net")
    target = next(n for n in hosts if n != source)
    tap = tap_name(uid, 0)
    before = await ticking(hosts[source], "net", past=0)
    assert before.disk == token
    assert ADDRESS.search(serial(hosts[source], "net")), "the guest leased no address"
    assert (taps(hosts[source]), taps(hosts[target])) == ({tap: uid}, {})

    moved = await virtbus(system, "migrate", "net")
    assert moved.code == 0, moved.err
    await eventually(lambda: migration(vb, "net", "Succeeded"), timeout=MIGRATE_SECONDS,
                     what="the migration Succeeded")
    vmi = await vb.get("VirtualMachineInstance", "default", "net")
    assert (vmi["metadata"]["uid"], vmi["status"]["nodeName"]) == (uid, target)
    await eventually(lambda: runs_only_on(hosts, target, "net"), timeout=MIGRATE_SECONDS,
                     what="the guest on its target only")
    arrived = await ticking(hosts[target], "net", past=0)
    assert ticks(hosts[target], "net")[0].number > before.number, \
        "the guest went on counting: moved, not booted again"
    assert arrived.disk == token
    assert (tap, derived_mac(uid, 0)) in await asyncio.to_thread(nics, hosts[target],
                                                                 "default_net")
    assert taps(hosts[target]) == {tap: uid}
    await eventually(lambda: _true(taps(hosts[source]) == {}), timeout=MIGRATE_SECONDS,
                     what="the source's tap removed")
    later = await ticking(hosts[target], "net", past=arrived.number)
    assert later.disk == token


async def test_a_cancelled_real_migration_leaves_the_guest_on_its_source(
        system: System, vb: Client, hosts: dict[str, LibvirtHost]) -> None:
    """At 1 MiB a second the guest's memory takes a while: cancelled once it is moving,
    libvirt aborts it and the guest runs on where it was, and only there."""
    await migration_config(vb, bandwidthPerMigration="1Mi")
    token = uuid.uuid4().hex[:12]
    await vb.apply(vm("slow", token))
    source, uid = await running_on(vb, "slow")
    target = next(n for n in hosts if n != source)
    await ticking(hosts[source], "slow", past=0)

    assert (await vb.act("VirtualMachineInstance", "migrate", "default", "slow")).accepted

    await eventually(lambda: moving(vb, "slow"), timeout=MIGRATE_SECONDS,
                     what="the guest's memory moving")
    cancelled = await virtbus(system, "migrate-cancel", "slow")
    assert cancelled.code == 0, cancelled.err
    failed = await eventually(lambda: migration(vb, "slow", "Failed"), timeout=MIGRATE_SECONDS,
                              what="the migration Failed")
    assert failed["status"]["reason"] == ABORTED_REASON
    vmi = await vb.get("VirtualMachineInstance", "default", "slow")
    assert (vmi["metadata"]["uid"], vmi["status"]["nodeName"]) == (uid, source)
    assert vmi["status"]["migrationState"]["abortStatus"] == "Succeeded"

    await eventually(lambda: runs_only_on(hosts, source, "slow"), timeout=MIGRATE_SECONDS,
                     what="the guest on its source only")
    last = ticks(hosts[source], "slow")[-1]
    assert (await ticking(hosts[source], "slow", past=last.number)).disk == token
    await eventually(lambda: _gone(hosts[target].base / "shared" / "default" / "slow"),
                     timeout=MIGRATE_SECONDS, what="the target's prepared files removed")


async def test_a_source_agent_killed_mid_migration_leaves_the_guest_on_its_source(
        system: System, vb: Client, hosts: dict[str, LibvirtHost]) -> None:
    """libvirtd goes on migrating when the agent that asked is killed; the next agent aborts
    the transfer it finds and reports it failed, and the guest runs on where it was."""
    await migration_config(vb, bandwidthPerMigration="1Mi")
    token = uuid.uuid4().hex[:12]
    await vb.apply(vm("orphan", token))
    source, uid = await running_on(vb, "orphan")
    await ticking(hosts[source], "orphan", past=0)
    assert (await vb.act("VirtualMachineInstance", "migrate", "default", "orphan")).accepted
    await eventually(lambda: moving(vb, "orphan"), timeout=MIGRATE_SECONDS,
                     what="the guest's memory moving")
    system.kill(source)
    system.start(source)
    failed = await eventually(lambda: migration(vb, "orphan", "Failed"),
                              timeout=MIGRATE_SECONDS, what="the migration Failed")
    assert failed["status"]["reason"] == SOURCE_RESTARTED_REASON
    vmi = await vb.get("VirtualMachineInstance", "default", "orphan")
    assert (vmi["metadata"]["uid"], vmi["status"]["nodeName"], vmi["status"]["phase"]) == (
        uid, source, "Running")
    await eventually(lambda: runs_only_on(hosts, source, "orphan"), timeout=MIGRATE_SECONDS,
                     what="the guest on its source only")
    last = ticks(hosts[source], "orphan")[-1]
    assert (await ticking(hosts[source], "orphan", past=last.number)).disk == token


async def test_past_its_completion_timeout_a_real_migration_aborts_or_goes_post_copy(
        system: System, vb: Client, hosts: dict[str, LibvirtHost]) -> None:
    """At 1 MiB a second the guest cannot move within 1 s (completionTimeoutPerGiB 1 for
    under a GB): without post-copy the job is aborted and the guest stays; with it, QEMU
    switches to post-copy, the guest runs on the target at once and its memory follows."""
    await migration_config(vb, bandwidthPerMigration="1Mi", completionTimeoutPerGiB=1,
                           allowAutoConverge=True)
    token = uuid.uuid4().hex[:12]
    await vb.apply(vm("late", token))
    source, uid = await running_on(vb, "late")
    target = next(n for n in hosts if n != source)
    await ticking(hosts[source], "late", past=0)
    assert (await vb.act("VirtualMachineInstance", "migrate", "default", "late")).accepted
    failed = await eventually(lambda: migration(vb, "late", "Failed"),
                              timeout=MIGRATE_SECONDS, what="the migration Failed")
    assert failed["status"]["reason"] == COMPLETION_TIMEOUT
    await eventually(lambda: runs_only_on(hosts, source, "late"), timeout=MIGRATE_SECONDS,
                     what="the guest on its source only")

    await migration_config(vb, bandwidthPerMigration="1Mi", completionTimeoutPerGiB=1,
                           allowAutoConverge=True, allowPostCopy=True)
    assert (await vb.act("VirtualMachineInstance", "migrate", "default", "late")).accepted
    done = await eventually(lambda: migration(vb, "late", "Succeeded"),
                            timeout=MIGRATE_SECONDS, what="the migration Succeeded")
    assert done["status"]["migrationState"]["mode"] == "PostCopy"
    vmi = await vb.get("VirtualMachineInstance", "default", "late")
    assert (vmi["metadata"]["uid"], vmi["status"]["nodeName"]) == (uid, target)
    await eventually(lambda: runs_only_on(hosts, target, "late"), timeout=MIGRATE_SECONDS,
                     what="the guest on its target only")
    arrived = await ticking(hosts[target], "late", past=0)
    assert arrived.disk == token


async def moving(vb: Client, name: str) -> bool:
    """The VMI's migration is Running and has sent some of the guest."""
    found = await migration(vb, name, "Running")
    return bool(found and found["status"].get("progress", {}).get("dataProcessedBytes"))


async def _gone(path: Path) -> bool:
    return not path.exists()


async def _true(value: bool) -> bool:
    return value
