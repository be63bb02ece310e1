"""What the converter needs besides the spec: identity, host and cluster facts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

from nodeagent.converter import defaults
from nodeagent.hostpaths import vmi_path

if TYPE_CHECKING:
    from collections.abc import Mapping

DomainType = Literal["kvm", "qemu", "test"]


def domain_name(namespace: str, name: str) -> str:
    """KubeVirt names a VMI's domain `<namespace>_<name>`; the agent finds guests by it."""
    return f"{namespace}_{name}"


class HostInterface(msgspec.Struct, frozen=True, kw_only=True):
    """The host side of one spec interface on a real host: the tap the agent made for it and
    its MAC (`nodeagent.network`)."""

    tap: str
    mac: str


class ConverterContext(msgspec.Struct, frozen=True, kw_only=True):
    """Per-launch inputs that the VMI spec does not carry.

    `default_cpu_model` is the HyperConverged `defaultCPUModel` ("" when unset). `memfd` is
    false when the VMI's `kubevirt.io/memfd` annotation is "false" (`memfd_from_annotations`).
    """

    name: str
    namespace: str = "default"
    uid: str = ""
    domain_type: DomainType = "kvm"
    default_cpu_model: str = ""
    disk_dir: str = defaults.DISK_DIR
    run_dir: str = defaults.RUN_DIR
    ovmf_dir: str = defaults.OVMF_DIR
    memfd: bool = True
    serial_log: bool = False
    """Log the serial console to a file beside its socket (`console.SERIAL_LOG`)."""
    installation: str = ""
    """The launching agent's installation (its prefix), kept in the domain's metadata: an
    agent takes only its own installation's domains for its own; '' names none."""
    host_interfaces: tuple[HostInterface, ...] = ()
    """Per spec interface, by index; none: KubeVirt's in-pod `tap<index>` and the spec's MAC
    (libvirt makes one up where it gives none)."""

    @property
    def domain_name(self) -> str:
        return domain_name(self.namespace, self.name)

    @property
    def disk_path(self) -> str:
        """This VMI's directory of disk images and NVRAM (`HostPathError` if its names would
        put it anywhere else)."""
        return vmi_path(self.disk_dir, self.namespace, self.name)

    def disk_file(self, file_name: str) -> str:
        """A file in this VMI's disk directory (`HostPathError` if it would lie elsewhere)."""
        return vmi_path(self.disk_dir, self.namespace, self.name, file_name)

    @property
    def socket_path(self) -> str:
        """This VMI's directory of VNC and serial console sockets (`HostPathError` if its
        names would put it anywhere else)."""
        return vmi_path(self.run_dir, self.namespace, self.name)


def memfd_from_annotations(annotations: Mapping[str, object]) -> bool:
    """KubeVirt backs hugepages with memfd unless the VMI's annotation says "false"."""
    return annotations.get(defaults.MEMFD_ANNOTATION) != "false"
