"""`<tpm>`: an emulated TPM 2.0 (swtpm), as KubeVirt's TPMDomainConfigurator renders it.

| spec.domain.devices.tpm        | model    | backend                                |
|--------------------------------|----------|----------------------------------------|
| absent, or `enabled: false`    | none     |                                        |
| `{}`                           | tpm-tis  | emulator 2.0                           |
| `persistent: true`             | tpm-crb  | emulator 2.0, persistent_state='yes'   |
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeagent.converter.xmltree import child, sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element

TPM_VERSION = "2.0"


def configure_tpm(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    tpm = spec.domain.devices.tpm
    if tpm is None or tpm.enabled is False:
        return
    persistent = bool(tpm.persistent)
    element = sub(child(domain, "devices"), "tpm", model="tpm-crb" if persistent else "tpm-tis")
    backend = sub(element, "backend", type="emulator", version=TPM_VERSION)
    if persistent:
        backend.set("persistent_state", "yes")
