"""The vocabulary of the VMI spec's admission rules (`events.api.validation`): KubeVirt's
allowed values and limits, and the checks every rule is made of, each raising
`InvalidSpec(field, rule)` with the JSON path of the offending field."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from events.api.errors import InvalidSpec
from events.api.names import (
    DNS1123_LABEL,
    DNS1123_LABEL_MAX,
    DNS1123_LABEL_RULE,
)
from events.api.resources import quantity

if TYPE_CHECKING:
    from collections.abc import Iterable
    from decimal import Decimal

    from events.api.domain import (
        Quantity,
    )

EMULATED_MACHINES = ("q35*", "pc-q35*")
"""KubeVirt's default amd64 `emulatedMachines` (the HyperConverged leaves them unset): the
machine types a VMI may ask for, as shell patterns. q35 only: KubeVirt supports no i440fx."""
START_PAUSED = "Paused"
"""The one `startStrategy` KubeVirt knows: the guest is created paused."""
CPU_FEATURE_POLICIES = ("force", "require", "optional", "disable", "forbid")
INPUT_TYPES = ("tablet",)
INPUT_BUSES = ("virtio", "usb")
DISK_BUSES = ("virtio", "sata", "scsi", "usb")
CDROM_BUSES = ("sata", "scsi", "usb")
LUN_BUSES = ("scsi",)
"""SCSI passthrough (`device='lun'`) and persistent reservations (QEMU's scsi-block with a
pr-manager) need a SCSI controller: virtbus takes scsi only, and defaults to it, where KubeVirt
lists more buses and defaults an unset one to sata on amd64 as for any disk."""
LUN_VOLUME_SOURCES = "dataVolume or persistentVolumeClaim"
"""A LUN is a block device: only a claim can be one (KubeVirt's rule)."""
HUGEPAGE_SIZES = ("2Mi", "1Gi")
"""The x86_64 sizes a node can pre-allocate; any other size can never be scheduled."""
TICK_POLICIES = {
    "hpet": ("delay", "catchup", "merge", "discard"),
    "pit": ("delay", "catchup", "discard"),
    "rtc": ("delay", "catchup"),
}
RTC_TRACKS = ("guest", "wall")
MIN_SPINLOCK_RETRIES = 4096
MAX_VENDORID_LENGTH = 12
HYPERV_REQUIRES = {
    "synic": "vpindex",
    "synictimer": "synic",
    "ipi": "vpindex",
    "tlbflush": "vpindex",
    "evmcs": "vapic",
}
"""Hyper-V enlightenments that QEMU refuses without another (KubeVirt's dependency list)."""
IO_THREADS_POLICIES = ("shared", "auto", "supplementalPool")
VIDEO_TYPES = ("vga", "cirrus", "virtio", "ramfb", "bochs")
"""The video models KubeVirt admits on amd64."""
WATCHDOG_ACTIONS = ("poweroff", "reset", "shutdown")
DNS_POLICIES = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
MAX_DNS_NAMESERVERS = 3
MAX_DNS_SEARCH_PATHS = 6
MAX_DNS_SEARCH_LIST_CHARS = 256
PORT_PROTOCOLS = ("TCP", "UDP")
PORT_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
PORT_NAME_MAX = 15

INTERFACE_NAME = re.compile(r"[A-Za-z0-9_-]+")
INTERFACE_NAME_RULE = "can only contain letters, digits, dashes (-) or underscores (_)"
"""KubeVirt's rule for an interface's name; a network is paired with the interface of its
name, so it holds for network names too."""


def require(ok: bool, field: str, rule: str) -> None:
    if not ok:
        raise InvalidSpec(field, rule)


def parsed(value: Quantity, field: str) -> Decimal:
    try:
        return quantity(value)
    except ValueError:
        raise InvalidSpec(field, "must be a quantity such as 512Mi, 2Gi or 2") from None


def one_of(value: str, allowed: Iterable[str], field: str) -> None:
    allowed = tuple(allowed)
    require(value in allowed, field, f"must be one of {', '.join(allowed)}; got {value!r}")


def dns1123_label(name: str, field: str) -> None:
    """Volume names, as Kubernetes requires of a pod's volume names (KubeVirt's API says so of
    a VMI's, and makes launcher pod volumes of them); a disk's name is its volume's. The
    agent makes host files of them (`<volume>.img`), so nothing else may pass."""
    require(
        len(name) <= DNS1123_LABEL_MAX and DNS1123_LABEL.fullmatch(name) is not None,
        field,
        f"{DNS1123_LABEL_RULE}; got {name!r}",
    )


def interface_name(name: object, field: str) -> None:
    require(
        isinstance(name, str) and INTERFACE_NAME.fullmatch(name) is not None,
        field,
        f"{INTERFACE_NAME_RULE}; got {name!r}",
    )


def unique(names: list[str], field: str) -> None:
    """`field` is a format string taking the list index of the first repeated name."""
    seen: set[str] = set()
    for index, name in enumerate(names):
        require(name not in seen, field.format(index), f"name {name!r} is used twice")
        seen.add(name)


