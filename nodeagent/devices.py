"""Device-plugin accounting for `devices.kubevirt.io/kvm` and `/tun`, as virt-handler advertises.

Each VMI holds what its launch took while its domain runs (a kvm device unless the host
emulates, a tun device when it has an interface). Holdings are keyed by VMI uid, so a
repeated launch (a redelivered command, an agent restart) never takes a second device, and
the ledger can be rebuilt from the domains found running after a restart: one of each at
first, corrected from each VMI's spec once the read service says what it is.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import structlog

from events.api.errors import VirtbusError
from events.api.resources import KVM_DEVICE, TUN_DEVICE

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

log = structlog.get_logger(__name__)

PER_VMI: Mapping[str, int] = {KVM_DEVICE: 1, TUN_DEVICE: 1}
"""What a VMI's virt-launcher asks for (the seed's pod spec: one kvm, one tun)."""


class DevicesExhausted(VirtbusError):
    """Every device of a resource is held; the VMI cannot launch on this node."""


class DeviceLedger:
    """Which VMI holds which devices; safe to call from the libvirt event thread."""

    def __init__(self, capacity: Mapping[str, int], *, node: str = "") -> None:
        self._capacity = dict(capacity)
        self._held: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()
        self._log = log.bind(node=node)

    @classmethod
    def rebuild(
        cls,
        capacity: Mapping[str, int],
        running_vmi_uids: Iterable[str],
        *,
        node: str = "",
        demand: Mapping[str, int] = PER_VMI,
    ) -> DeviceLedger:
        """The ledger after a restart: running domains hold their devices even past capacity.

        A host found over capacity is reported, not corrected: the guests are already running,
        and new launches are refused until enough of them stop.
        """
        ledger = cls(capacity, node=node)
        for uid in running_vmi_uids:
            ledger._held[uid] = dict(demand)
        for resource, used in ledger.in_use().items():
            if used > ledger._capacity.get(resource, 0):
                ledger._log.warning(
                    "devices over capacity after restart", resource=resource, in_use=used
                )
        return ledger

    def acquire(self, vmi_uid: str, demand: Mapping[str, int] = PER_VMI) -> None:
        """Take `demand` for a VMI; a VMI that already holds devices keeps what it has."""
        with self._lock:
            if vmi_uid in self._held:
                return
            in_use = self._in_use_locked()
            for resource, wanted in demand.items():
                free = self._capacity.get(resource, 0) - in_use.get(resource, 0)
                if wanted > free:
                    raise DevicesExhausted(
                        f"{resource}: {free} of {self._capacity.get(resource, 0)} free, "
                        f"VMI {vmi_uid} needs {wanted}; stop a VMI on this node or "
                        "schedule it elsewhere"
                    )
            self._held[vmi_uid] = dict(demand)
        self._log.debug("devices acquired", vmi_uid=vmi_uid, demand=dict(demand))

    def correct(self, vmi_uid: str, demand: Mapping[str, int]) -> None:
        """What a VMI rebuilt as holding `PER_VMI` really took, once known; a VMI that holds
        nothing (stopped meanwhile) is left alone."""
        with self._lock:
            if vmi_uid in self._held:
                self._held[vmi_uid] = dict(demand)

    def release(self, vmi_uid: str) -> None:
        """Give a VMI's devices back; releasing twice is harmless."""
        with self._lock:
            released = self._held.pop(vmi_uid, None)
        if released is not None:
            self._log.debug("devices released", vmi_uid=vmi_uid)

    def tracked(self) -> frozenset[str]:
        """The resources this ledger counts (its capacity's, fixed at creation)."""
        return frozenset(self._capacity)

    def holders(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._held)

    def in_use(self) -> dict[str, int]:
        with self._lock:
            return self._in_use_locked()

    def available(self) -> dict[str, int]:
        """Free devices per resource, never below zero."""
        in_use = self.in_use()
        return {r: max(c - in_use.get(r, 0), 0) for r, c in self._capacity.items()}

    def _in_use_locked(self) -> dict[str, int]:
        totals = dict.fromkeys(self._capacity, 0)
        for demand in self._held.values():
            for resource, count in demand.items():
                totals[resource] = totals.get(resource, 0) + count
        return totals
