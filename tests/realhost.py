"""What tests of real guests need from the host, found or failed for loudly, and the guest
they boot.

`./dev test` installs it (qemu-system-x86, qemu-utils, libvirt-daemon-system, a kernel,
busybox-static; iproute2, dnsmasq-base, dnsmasq-utils and nftables for guest networking). A
test that lacks it fails with what to install: a skip would stand in for work nobody
checked.

The guest is the host's own kernel (`kernelBoot`, from the image store) with a busybox
initramfs whose init prints the first bytes of its containerDisk and the user-data of its
NoCloud ISO on the serial console, opens the QEMU guest agent's port (as a guest agent
would: libvirt then says the agent connected), says it is ready once it listens to the ACPI
power button, and powers off when the button is pressed.
"""

from __future__ import annotations

import contextlib
import glob
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest

from nodeagent.converter.defaults import GUEST_AGENT_CHANNEL
from nodeagent.virterror import quiet_libvirt_errors

QEMU = "qemu-system-x86_64"
QEMU_IMG = "qemu-img"


def require(program: str, package: str) -> str:
    """The path of `program`, or the test fails naming the Debian package to install."""
    path = shutil.which(program)
    if path is None:
        pytest.fail(f"{program} is not installed: apt-get install {package} "
                    "(./dev test installs it)", pytrace=False)
    return path


URI = "qemu:///system"
BOOT_DEADLINE_SECONDS = 60.0
"""A deadline, not a measure: the guest prints its lines in some 3 s under TCG."""
STOP_GRACE_SECONDS = 60
"""The stop's grace period: the guest powers off on the ACPI button long before."""
DISK_IMAGE = "virtbus.test/disk:1"
BOOT_IMAGE = "virtbus.test/boot:1"
DISK_MARKER = b"virtbus-disk-marker"
MODULES = [  # in load order: virtio disks, serial ports and network, the ISO file system,
    # ACPI's button
    "drivers/virtio/virtio_ring.ko", "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_pci_legacy_dev.ko", "drivers/virtio/virtio_pci_modern_dev.ko",
    "drivers/virtio/virtio_pci.ko", "drivers/block/virtio_blk.ko",
    "drivers/char/virtio_console.ko", "net/core/failover.ko", "drivers/net/net_failover.ko",
    "drivers/net/virtio_net.ko", "drivers/cdrom/cdrom.ko",
    "fs/isofs/isofs.ko", "drivers/acpi/button.ko", "drivers/input/evdev.ko"]
DHCP_EVENT = """#!/bin/sh
case "$1" in
    bound|renew)
        ip addr flush dev "$interface"
        ip addr add "$ip/$mask" dev "$interface"
        router="${router%% *}"
        ip route add default via "$router" dev "$interface"
        echo "$ip" >/tmp/ip
        echo "$router" >/tmp/router
        ;;
esac
"""
"""udhcpc's event script: the lease applied, its address and gateway kept for the init."""
INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /mnt /tmp
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
for port in /sys/class/virtio-ports/*; do  # stands in for a guest agent: opens its port
    if [ "$(cat "$port/name")" = "GUEST_AGENT_CHANNEL" ]; then
        exec 9<>"/dev/${port##*/}"
        echo "virtbus-guest: guest agent channel open"
    fi
done
if [ -e /sys/class/net/eth0 ]; then  # a guest on the pod network: its address by DHCP
    ip link set lo up
    ip link set eth0 up
    if udhcpc -i eth0 -s /bin/dhcp-event -t 30 -T 2 -n -q; then
        echo "virtbus-guest: address $(cat /tmp/ip)"
    else
        echo "virtbus-guest: no DHCP lease"
    fi
fi
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
""".replace("MARKER_LENGTH", str(len(DISK_MARKER))).replace("GUEST_AGENT_CHANNEL",
                                                          GUEST_AGENT_CHANNEL)


def installed(package: str) -> bool:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True,
                          text=True, check=False)
    return done.stdout.endswith(" installed")


def host_kernel() -> tuple[Path, Path]:
    """The newest kernel in /boot and its modules' directory (`.../kernel`)."""
    kernels = sorted(glob.glob("/boot/vmlinuz-*"))
    if not kernels:
        pytest.fail("no kernel in /boot: apt-get install linux-image-cloud-amd64 "
                    "(./dev test installs it)", pytrace=False)
    kernel = kernels[-1]
    return Path(kernel), Path("/lib/modules", kernel.removeprefix("/boot/vmlinuz-"), "kernel")


def busybox_initramfs(target: Path, init: str, modules: list[str],
                      files: dict[str, str] | None = None) -> None:
    """A cpio initramfs at `target`: static busybox, `init`, the host kernel's `modules` (paths
    under its modules' directory, copied to /modules in load order) and executable `files`
    (path in the initramfs: content)."""
    if not installed("busybox-static"):
        pytest.fail("apt-get install busybox-static (./dev test installs it)", pytrace=False)
    _, module_dir = host_kernel()
    root = target.parent / (target.name + ".root")
    (root / "bin").mkdir(parents=True)
    (root / "modules").mkdir()
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    for index, module in enumerate(modules):
        shutil.copy(module_dir / module, root / "modules" / f"{index:02d}-{Path(module).name}")
    for path, content in {"init": init, **(files or {})}.items():
        (root / path).write_text(content)
        (root / path).chmod(0o755)
    names = subprocess.run(["find", "."], cwd=root, check=True, capture_output=True).stdout
    with open(target, "wb") as initrd:
        subprocess.run(["cpio", "--quiet", "-o", "-H", "newc"], cwd=root, input=names,
                       stdout=initrd, check=True)
    shutil.rmtree(root)


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
        # Another test process may be starting it too: whichever daemon wins, it answers.
        subprocess.run([program, "-d"], check=False)
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
    kernel, _ = host_kernel()
    base = Path(tempfile.mkdtemp(prefix="virtbus-real-guest-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        busybox_initramfs(base / "initrd.img", INIT, MODULES, {"bin/dhcp-event": DHCP_EVENT})
        shutil.copy(kernel, base / "vmlinuz")
        disk = base / "disk.raw"
        subprocess.run([QEMU_IMG, "create", "-q", "-f", "raw", str(disk), "1M"], check=True)
        with open(disk, "r+b") as raw:
            raw.write(DISK_MARKER)
        yield base
    finally:
        shutil.rmtree(base)


def guest_spec(disk_image: str, user_data: str) -> dict[str, Any]:
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
