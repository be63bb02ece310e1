"""`<os>` kernel, initrd and cmdline: booting a kernel directly instead of from a disk.

`firmware.kernelBoot.container` names an image holding the kernel and initrd; KubeVirt
copies each file out of it to `kernel-boot/<basename>` and points `<kernel>` / `<initrd>`
there (containerdisk.GetKernelBootArtifactPathFromLauncherView). The agent copies them from
its image store (`nodeagent.guestdisks`) into the VMI's disk directory under the same names.
`kernelArgs` becomes `<cmdline>`.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, NamedTuple

from nodeagent.converter.xmltree import child, sub
from nodeagent.hostpaths import vmi_path

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element

KERNEL_BOOT_DIR = "kernel-boot"


class KernelArtifact(NamedTuple):
    """A kernel or initrd: its `<os>` tag, its path in the image, and its file on the host
    (under the VMI's disk directory, confined by `vmi_path`), which the agent copies it to."""

    tag: str
    field: str
    path_in_image: str
    host_path: str


def kernel_artifacts(spec: VMISpecLike, ctx: ConverterContext) -> list[KernelArtifact]:
    firmware = spec.domain.firmware
    kernel_boot = firmware.kernel_boot if firmware is not None else None
    container = kernel_boot.container if kernel_boot is not None else None
    if container is None:
        return []
    return [KernelArtifact(tag, f"spec.domain.firmware.kernelBoot.container.{tag}Path", path,
                           vmi_path(ctx.disk_dir, ctx.namespace, ctx.name, KERNEL_BOOT_DIR,
                                    posixpath.basename(path.rstrip("/"))))  # filepath.Base
            for tag, path in (("kernel", container.kernel_path),
                              ("initrd", container.initrd_path)) if path]


def configure_kernel_boot(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    firmware = spec.domain.firmware
    kernel_boot = firmware.kernel_boot if firmware is not None else None
    if kernel_boot is None:
        return
    os_element = child(domain, "os")
    for artifact in kernel_artifacts(spec, ctx):
        sub(os_element, artifact.tag, artifact.host_path)
    if kernel_boot.kernel_args:
        sub(os_element, "cmdline", kernel_boot.kernel_args)
