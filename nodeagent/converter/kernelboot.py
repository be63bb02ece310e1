"""`<os>` kernel, initrd and cmdline: booting a kernel directly instead of from a disk.

`firmware.kernelBoot.container` names an image holding the kernel and initrd; KubeVirt
copies each file out of it to `kernel-boot/<basename>` and points `<kernel>` / `<initrd>`
there (containerdisk.GetKernelBootArtifactPathFromLauncherView). The agent expects the files
in the VMI's disk directory under the same names, as it expects a containerDisk's image.
`kernelArgs` becomes `<cmdline>`.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from nodeagent.converter.xmltree import child, sub
from nodeagent.hostpaths import vmi_path

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element

KERNEL_BOOT_DIR = "kernel-boot"


def configure_kernel_boot(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    firmware = spec.domain.firmware
    kernel_boot = firmware.kernel_boot if firmware is not None else None
    if kernel_boot is None:
        return
    os_element = child(domain, "os")
    container = kernel_boot.container
    if container is not None:
        for tag, path in (("kernel", container.kernel_path), ("initrd", container.initrd_path)):
            if path:
                artifact = vmi_path(ctx.disk_dir, ctx.namespace, ctx.name, KERNEL_BOOT_DIR,
                                    posixpath.basename(path.rstrip("/")))  # Go's filepath.Base
                sub(os_element, tag, artifact)
    if kernel_boot.kernel_args:
        sub(os_element, "cmdline", kernel_boot.kernel_args)
