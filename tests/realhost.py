"""What tests of real guests need from the host, found or failed for loudly.

`./dev test` installs it (qemu-system-x86, qemu-utils, libvirt-daemon-system, a kernel,
busybox-static). A test that lacks it fails with what to install: a skip would stand in
for work nobody checked.
"""

from __future__ import annotations

import shutil

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
