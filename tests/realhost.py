"""What tests of real guests need from the host, found or failed for loudly, and the guest
they boot: the host's own kernel with a busybox initramfs whose init the test writes.

`./dev test` installs it (qemu-system-x86, qemu-utils, libvirt-daemon-system, a kernel,
busybox-static). A test that lacks it fails with what to install: a skip would stand in
for work nobody checked.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
from pathlib import Path

import pytest

QEMU = "qemu-system-x86_64"
QEMU_IMG = "qemu-img"


def require(program: str, package: str) -> str:
    """The path of `program`, or the test fails naming the Debian package to install."""
    path = shutil.which(program)
    if path is None:
        pytest.fail(f"{program} is not installed: apt-get install {package} "
                    "(./dev test installs it)", pytrace=False)
    return path


def _installed(package: str) -> bool:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True,
                          text=True, check=False)
    return done.stdout.endswith(" installed")


def boot_files(base: Path, init: str, modules: list[str]) -> None:
    """`base/vmlinuz` (the host's newest kernel) and `base/initrd.img`: busybox, the kernel
    `modules` (paths in the kernel's module tree, copied to /modules in load order) and
    `init`."""
    kernels = sorted(glob.glob("/boot/vmlinuz-*"))
    if not kernels:
        pytest.fail("no kernel in /boot: apt-get install linux-image-cloud-amd64 "
                    "(./dev test installs it)", pytrace=False)
    if not _installed("busybox-static"):
        pytest.fail("apt-get install busybox-static (./dev test installs it)", pytrace=False)
    kernel = kernels[-1]
    tree = Path("/lib/modules", kernel.removeprefix("/boot/vmlinuz-"), "kernel")
    root = base / "initramfs"
    (root / "bin").mkdir(parents=True)
    (root / "modules").mkdir()
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    for index, module in enumerate(modules):
        shutil.copy(tree / module, root / "modules" / f"{index:02d}-{Path(module).name}")
    (root / "init").write_text(init)
    (root / "init").chmod(0o755)
    names = subprocess.run(["find", "."], cwd=root, check=True, capture_output=True).stdout
    with open(base / "initrd.img", "wb") as initrd:
        subprocess.run(["cpio", "--quiet", "-o", "-H", "newc"], cwd=root, input=names,
                       stdout=initrd, check=True)
    shutil.copy(kernel, base / "vmlinuz")
