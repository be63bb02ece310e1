"""`<features>`: ACPI, APIC, SMM, KVM and Hyper-V enlightenments.

Always written, as KubeVirt always gives a VMI `features: {}`: ACPI is on unless
`acpi.enabled: false` (a guest without ACPI cannot be asked to shut down) and VMware's I/O
port is off (amd64). Hyper-V names map one to one except `synictimer` -> `<stimer>` and
`vendorid` -> `<vendor_id>`; `tlbflush` carries its `direct` / `extended` variants as
children. `hypervPassthrough` (only without `hyperv`) is `<hyperv mode='passthrough'/>`.
A Hyper-V feature whose prerequisite is absent gets the
prerequisite switched on (KubeVirt's mutating webhook does the same); a disabled
prerequisite is refused earlier by validation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from events.api.domain import Features
from events.api.spec_rules import HYPERV_REQUIRES
from events.api.vmi_defaults import spinlock_retries
from nodeagent.converter.xmltree import on_off, sub

if TYPE_CHECKING:
    from events.api.domain import FeatureHyperv, FeatureState
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element

HYPERV_SIMPLE = (
    "relaxed",
    "vapic",
    "vpindex",
    "runtime",
    "synic",
    "reset",
    "frequencies",
    "reenlightenment",
    "tlbflush",
    "ipi",
    "evmcs",
)
"""Hyper-V features that are just on/off, in the order libvirt writes them."""


def configure_features(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    source = spec.domain.features or Features()
    features = sub(domain, "features")
    if _enabled(source.acpi):
        sub(features, "acpi")
    if source.apic is not None and source.apic.enabled is not False:
        apic = sub(features, "apic")
        if source.apic.end_of_interrupt:
            apic.set("eoi", "on")
    if source.hyperv is not None:
        _configure_hyperv(source.hyperv, sub(features, "hyperv", mode="custom"))
    elif _enabled(source.hyperv_passthrough):
        sub(features, "hyperv", mode="passthrough")
    _configure_kvm(source, features)
    sub(features, "vmport", state="off")


def _enabled(state: FeatureState | None) -> bool:
    return state is not None and state.enabled is not False


def _configure_kvm(source: Features, features: Element) -> None:
    if source.kvm is not None:
        sub(sub(features, "kvm"), "hidden", state=on_off(source.kvm.hidden, default=False))
    if source.pvspinlock is not None:
        sub(features, "pvspinlock", state=on_off(source.pvspinlock.enabled, default=True))
    if _enabled(source.smm):
        sub(features, "smm", state="on")


def hyperv_states(hyperv: FeatureHyperv) -> dict[str, bool]:
    """Requested on/off per Hyper-V feature, with missing prerequisites switched on."""
    states = {
        name: getattr(hyperv, name).enabled is not False
        for name in (*HYPERV_SIMPLE, "spinlocks", "synictimer", "vendorid")
        if getattr(hyperv, name) is not None
    }
    changed = True
    while changed:
        changed = False
        for feature, required in HYPERV_REQUIRES.items():
            if states.get(feature) and required not in states:
                states[required] = True
                changed = True
    return states


def _configure_hyperv(hyperv: FeatureHyperv, element: Element) -> None:
    states = hyperv_states(hyperv)
    for name in HYPERV_SIMPLE:
        if name in states:
            sub(element, name, state=on_off(states[name], default=True))
    tlbflush, flush_element = hyperv.tlbflush, element.find("tlbflush")
    if tlbflush is not None and flush_element is not None:
        for variant, wanted in (("direct", tlbflush.direct), ("extended", tlbflush.extended)):
            if wanted is not None:
                sub(flush_element, variant, state=on_off(wanted.enabled, default=True))
    if hyperv.spinlocks is not None:
        spinlocks = sub(element, "spinlocks", state=on_off(states["spinlocks"], default=True))
        retries = spinlock_retries(hyperv)
        if retries is not None:
            spinlocks.set("retries", str(retries))
    if hyperv.synictimer is not None:
        stimer = sub(element, "stimer", state=on_off(states["synictimer"], default=True))
        if hyperv.synictimer.direct is not None:
            direct = hyperv.synictimer.direct.enabled
            sub(stimer, "direct", state=on_off(direct, default=True))
    if hyperv.vendorid is not None:
        state = on_off(states["vendorid"], default=True)
        sub(element, "vendor_id", state=state, value=hyperv.vendorid.vendorid)
