"""Device-plugin accounting: one kvm and one tun per VMI, never twice, never past capacity."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libvirt
import pytest

from events.api.resources import KVM_DEVICE, TUN_DEVICE
from nodeagent.devices import DeviceLedger, DevicesExhausted
from nodeagent.lifecycle import define_and_start, graceful_stop

if TYPE_CHECKING:
    from collections.abc import Callable

    from nodeagent.watcher import LifecycleWatcher

CAPACITY = {KVM_DEVICE: 2, TUN_DEVICE: 2}


def test_acquire_takes_one_of_each_and_is_idempotent_per_vmi() -> None:
    ledger = DeviceLedger(CAPACITY)
    ledger.acquire("uid-a")
    ledger.acquire("uid-a")
    assert ledger.in_use() == {KVM_DEVICE: 1, TUN_DEVICE: 1}
    assert ledger.available() == {KVM_DEVICE: 1, TUN_DEVICE: 1}


def test_exhaustion_is_refused_with_the_resource_named() -> None:
    ledger = DeviceLedger(CAPACITY)
    ledger.acquire("uid-a")
    ledger.acquire("uid-b")
    with pytest.raises(DevicesExhausted, match=r"devices.kubevirt.io/kvm: 0 of 2 free.*uid-c"):
        ledger.acquire("uid-c")
    assert ledger.holders() == {"uid-a", "uid-b"}
    assert ledger.tracked() == {KVM_DEVICE, TUN_DEVICE}  # still counted when none is free


def test_release_frees_and_repeats_safely() -> None:
    ledger = DeviceLedger(CAPACITY)
    ledger.acquire("uid-a")
    ledger.acquire("uid-b")
    ledger.release("uid-a")
    ledger.release("uid-a")
    ledger.acquire("uid-c")
    assert ledger.holders() == {"uid-b", "uid-c"}


def test_a_vmi_without_network_takes_no_tun() -> None:
    ledger = DeviceLedger(CAPACITY)
    ledger.acquire("uid-a", {KVM_DEVICE: 1})
    assert ledger.in_use() == {KVM_DEVICE: 1, TUN_DEVICE: 0}


def test_rebuild_from_running_domains(
    conn: libvirt.virConnect, watcher: LifecycleWatcher, domain_xml: Callable[..., str]
) -> None:
    started = [define_and_start(conn, domain_xml()) for _ in range(2)]
    running = {
        d.UUIDString() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
    }
    ledger = DeviceLedger.rebuild({KVM_DEVICE: 110, TUN_DEVICE: 110}, running)
    assert {d.UUIDString() for d in started} <= ledger.holders()
    assert ledger.in_use()[KVM_DEVICE] == len(running)
    for dom in started:
        graceful_stop(conn, dom.name(), 0, watcher)


def test_rebuild_past_capacity_keeps_the_guests_and_refuses_new_ones() -> None:
    ledger = DeviceLedger.rebuild(CAPACITY, ["a", "b", "c"])
    assert ledger.in_use() == {KVM_DEVICE: 3, TUN_DEVICE: 3}
    assert ledger.available() == {KVM_DEVICE: 0, TUN_DEVICE: 0}
    with pytest.raises(DevicesExhausted):
        ledger.acquire("d")
    ledger.release("a")
    ledger.release("b")
    ledger.acquire("d")
