"""What tests of real guests need from the host, found or failed for loudly.

`./dev test` installs it (qemu-system-x86, qemu-utils, libvirt-daemon-system, a kernel,
busybox-static; iproute2, dnsmasq-base, dnsmasq-utils and nftables for guest networking). A
test that lacks it fails with what to install: a skip would stand in for work nobody
checked.
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
