"""A real guest, booted by a real node agent on `qemu:///system` (libvirtd, QEMU under the
hypervisor the agent's probe chose: TCG on a host whose KVM runs no guest).

The guest is the host's own kernel (`kernelBoot`, from the image store) with a busybox
initramfs whose init prints the first bytes of its containerDisk (a copy-on-write overlay
on an image imported into the store) and the user-data of its NoCloud ISO on the serial
console, says it is ready once it listens to the ACPI power button, and powers off when
the button is pressed. The test reads the serial
console log, stops the VMI gracefully (the guest hears the button: `ShutDown`, not
`Destroyed`), and sees every file the agent made for the guest gone. A missing image fails
the launch with its reason and defines nothing.

What it needs (QEMU, libvirt, qemu-img, a kernel, busybox-static) `./dev test` installs; a
host without it fails here with what to install, never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest
from nats.js.api import ConsumerConfig
from nats.js.client import JetStreamContext

from events.messages import NodeCommand, NodeReport
from nodeagent.converter import defaults as converter_defaults
from nodeagent.converter.console import SERIAL_LOG
from nodeagent.imagestore import ImageStore
from nodeagent.virterror import quiet_libvirt_errors
from tests.nodeagent.helpers import Cluster, Running, next_report, start
from tests.nodeagent.test_work import publish, worked_through
from tests.realhost import QEMU, QEMU_IMG, boot_files, require

URI = "qemu:///system"
BOOT_DEADLINE_SECONDS = 60.0
"""A deadline, not a measure: the guest prints its lines in some 3 s under TCG."""
STOP_GRACE_SECONDS = 60
"""The stop's grace period: the guest powers off on the ACPI button long before."""
DISK_IMAGE = "virtbus.test/disk:1"
BOOT_IMAGE = "virtbus.test/boot:1"
DISK_MARKER = b"virtbus-disk-marker"
MODULES = [  # in load order: virtio disks, the ISO file system, the ACPI power button
    "drivers/virtio/virtio_ring.ko", "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_pci_legacy_dev.ko", "drivers/virtio/virtio_pci_modern_dev.ko",
    "drivers/virtio/virtio_pci.ko", "drivers/block/virtio_blk.ko", "drivers/cdrom/cdrom.ko",
    "fs/isofs/isofs.ko", "drivers/acpi/button.ko", "drivers/input/evdev.ko"]
INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /mnt
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for module in /modules/*.ko; do insmod "$module"; done
echo "virtbus-guest: init started"
for disk in /dev/vd?; do
    if mount -t iso9660 -o ro "$disk" /mnt 2>/dev/null; then
        echo "virtbus-guest: user-data: $(cat /mnt/user-data)"
    else
        echo "virtbus-guest: disk: $(head -c MARKER_LENGTH "$disk")"
    fi
done
fd=3
for device in /sys/class/input/event*; do  # ACPI may give more than one: any will do
    if [ "$(cat "$device/device/name")" = "Power Button" ]; then
        eval "exec $fd<\"/dev/input/${device##*/}\""  # open before "ready": no press lost
        (head -c 1 <&$fd >/dev/null; echo "virtbus-guest: power button"; poweroff -f) &
        fd=$((fd + 1))
    fi
done
echo "virtbus-guest: ready"
wait
""".replace("MARKER_LENGTH", str(len(DISK_MARKER)))


@pytest.fixture(scope="module")
def libvirtd() -> None:
    """qemu:///system answering: libvirtd and virtlogd started as daemons if they are not
    (there may be no init system to start them)."""
    require(QEMU, "qemu-system-x86")
    require(QEMU_IMG, "qemu-utils")
    quiet_libvirt_errors()
    with contextlib.suppress(libvirt.libvirtError):
        libvirt.open(URI).close()
        return
    for daemon in ("virtlogd", "libvirtd"):
        program = shutil.which(daemon) or shutil.which(daemon, path="/usr/sbin")
        if program is None:
            pytest.fail(f"{daemon} is not installed: apt-get install libvirt-daemon-system "
                        "(./dev test installs it)", pytrace=False)
        subprocess.run([program, "-d"], check=True)
    deadline = time.monotonic() + BOOT_DEADLINE_SECONDS
    while True:
        try:
            libvirt.open(URI).close()
            return
        except libvirt.libvirtError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)  # retry backoff while libvirtd starts


@pytest.fixture(scope="module")
def guest_files() -> Iterator[Path]:
    """A directory the qemu user can read, with the kernel, an initramfs and a disk."""
    base = Path(tempfile.mkdtemp(prefix="virtbus-real-guest-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        boot_files(base, INIT, MODULES)
        disk = base / "disk.raw"
        subprocess.run([QEMU_IMG, "create", "-q", "-f", "raw", str(disk), "1M"], check=True)
        with open(disk, "r+b") as raw:
            raw.write(DISK_MARKER)
        yield base
    finally:
        shutil.rmtree(base)


@pytest.fixture
async def real_agent(libvirtd: None, guest_files: Path, cluster: Cluster,
                     nats_url: str) -> AsyncIterator[tuple[Running, Path]]:
    host = Path(tempfile.mkdtemp(prefix="virtbus-host-", dir="/var/tmp"))
    host.chmod(0o755)
    store = ImageStore(str(host / "images"))
    store.import_file(DISK_IMAGE, str(guest_files / "disk.raw"))
    store.import_file(BOOT_IMAGE, str(guest_files / "vmlinuz"), "/boot/vmlinuz")
    store.import_file(BOOT_IMAGE, str(guest_files / "initrd.img"), "/boot/initrd.img")
    running = await start(cluster, nats_url, libvirt_uri=URI, disk_dir=str(host / "disks"),
                          image_dir=store.root)
    try:
        yield running, host
    finally:
        await running.close()
        conn = libvirt.open(URI)
        for dom in conn.listAllDomains(0):  # what a failed test left
            if dom.name().startswith(f"{cluster.namespace}_"):
                with contextlib.suppress(libvirt.libvirtError):
                    dom.destroy()
                with contextlib.suppress(libvirt.libvirtError):
                    dom.undefine()
        conn.close()
        shutil.rmtree(host)
        shutil.rmtree(Path(converter_defaults.RUN_DIR, cluster.namespace), ignore_errors=True)


def _spec(disk_image: str, user_data: str) -> dict[str, Any]:
    return {
        "domain": {
            "firmware": {"kernelBoot": {
                "kernelArgs": "console=ttyS0 panic=-1 quiet",
                "container": {"image": BOOT_IMAGE, "kernelPath": "/boot/vmlinuz",
                              "initrdPath": "/boot/initrd.img"}}},
            "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}},
                                  {"name": "cidata", "disk": {"bus": "virtio"}}]},
            "resources": {"requests": {"memory": "256Mi"}},
        },
        "terminationGracePeriodSeconds": STOP_GRACE_SECONDS,
        "volumes": [{"name": "root", "containerDisk": {"image": disk_image}},
                    {"name": "cidata", "cloudInitNoCloud": {"userData": user_data}}],
    }


async def _console_line(log: Path, text: str, running: Running) -> str:
    """The serial console's log once it holds `text` (polled until the deadline)."""
    deadline = time.monotonic() + BOOT_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        assert not running.task.done(), "the agent ended"
        content = log.read_text(errors="replace") if log.exists() else ""
        if text in content:
            return content
        await asyncio.sleep(0.1)  # poll interval of the console log
    raise AssertionError(f"no {text!r} on the serial console in {BOOT_DEADLINE_SECONDS} s:\n"
                         + (log.read_text(errors="replace") if log.exists() else "(no log)"))


async def _reports(cluster: Cluster) -> JetStreamContext.PullSubscription:
    """The agent's reports; the consumer outlives the test's waits on the console (an
    ephemeral one idle for 5 s is deleted by the server)."""
    return await cluster.nc.jetstream().pull_subscribe(
        cluster.layout.reports_filter, stream=cluster.layout.reports_stream,
        config=ConsumerConfig(inactive_threshold=3 * BOOT_DEADLINE_SECONDS))


def _domain_report(name: str, phase: str) -> Callable[[NodeReport], bool]:
    return lambda r: r.domain is not None and (r.domain.name, r.domain.phase) == (name, phase)


async def test_a_real_guest_boots_reads_its_disks_and_stops_on_acpi(
        cluster: Cluster, real_agent: tuple[Running, Path]) -> None:
    running, host = real_agent
    reports = await _reports(cluster)
    user_data = f"hello-{uuid.uuid4().hex[:8]}"
    spec = _spec(DISK_IMAGE, user_data)
    ref = await cluster.placed("guest", spec)
    await publish(cluster, cluster.launch(ref, spec))
    await next_report(reports, _domain_report(ref.name, "Running"))

    log = Path(converter_defaults.RUN_DIR, ref.namespace, ref.name, SERIAL_LOG)
    console = await _console_line(log, "virtbus-guest: ready", running)
    assert f"virtbus-guest: user-data: {user_data}" in console
    assert f"virtbus-guest: disk: {DISK_MARKER.decode()}" in console
    vmi_dir = host / "disks" / ref.namespace / ref.name
    assert {p.name for p in vmi_dir.iterdir()} >= {"root.qcow2", "cidata.iso", "kernel-boot"}

    stop = NodeCommand(event_id=str(uuid.uuid4()), verb="stop", namespace=ref.namespace,
                       name=ref.name, uid=ref.uid, grace_period_seconds=STOP_GRACE_SECONDS)
    await publish(cluster, stop)
    assert "virtbus-guest: power button" in await _console_line(log, "power button", running)
    stopped = await next_report(reports, _domain_report(ref.name, "Succeeded"))
    assert stopped.domain is not None
    assert (stopped.domain.phase, stopped.domain.reason, stopped.domain.gone) == (
        "Succeeded", "stopped on request (ShutDown)", True)
    assert not vmi_dir.exists(), "the overlay, the ISO and the kernel stay behind"
    assert not log.parent.exists()
    assert Path(running.agent.images.resolve("image", DISK_IMAGE)).exists()


async def test_a_missing_image_fails_the_launch_and_defines_nothing(
        cluster: Cluster, real_agent: tuple[Running, Path]) -> None:
    running, host = real_agent
    reports = await _reports(cluster)
    spec = _spec("virtbus.test/missing:1", "unused")
    ref = await cluster.placed("lost", spec)
    await worked_through(cluster, running, await publish(cluster, cluster.launch(ref, spec)))
    report = await next_report(reports, _domain_report(ref.name, "Failed"))
    assert report.domain is not None
    assert report.domain.reason == (
        "launch failed: spec.volumes[0].containerDisk.image: image 'virtbus.test/missing:1' "
        f"is not in this node's image store ({host / 'images'}); import it: virtbus node "
        "import-image virtbus.test/missing:1 FILE")
    assert ref.domain not in {d.name for d in running.agent.summaries()}
    assert not (host / "disks" / ref.namespace / ref.name).exists()
    assert not os.path.exists(Path(converter_defaults.RUN_DIR, ref.namespace, ref.name))
