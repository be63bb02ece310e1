"""The read API's kinds and their short names. The query/answer messages themselves are in
`events.language.query`, since node agents ask too."""

from __future__ import annotations

from typing import Final

from events.api.errors import InvalidSpec
from events.api.hco_defaults import KIND as HCO_API_KIND
from events.api.replicaset import PRESET, REPLICA_SET
from events.language.kinds.hco import HCO_KIND, OPERAND_TOKENS
from events.language.kinds.instancetype import KIND_TOKENS as INSTANCETYPE_TOKENS
from events.language.kinds.instancetype import REVISION_KIND, REVISION_TOKEN
from events.language.kinds.migration import MIGRATION_KIND
from events.language.kinds.nodes import NODE_KIND
from events.language.kinds.preset import PRESET_KIND
from events.language.kinds.replicaset import REPLICA_SET_KIND
from events.language.kinds.vm import VM_KIND, VMI_KIND

KINDS: Final = {
    "VirtualMachine": ("vm", "vms", "virtualmachine", "virtualmachines"),
    "VirtualMachineInstance": ("vmi", "vmis", "virtualmachineinstance",
                               "virtualmachineinstances"),
    "VirtualMachineInstanceMigration": ("vmim", "vmims", "virtualmachineinstancemigration",
                                        "virtualmachineinstancemigrations"),
    "Node": ("node", "nodes", "no"),
    "HyperConverged": ("hco", "hcos", "hyperconverged", "hyperconvergeds"),
    "KubeVirt": ("kubevirt", "kubevirts", "kv", "kvs"),
    "CDI": ("cdi", "cdis"),
    "NetworkAddonsConfig": ("networkaddonsconfig", "networkaddonsconfigs"),
    "SSP": ("ssp", "ssps"),
    "VirtualMachineInstancetype": ("vminstancetype", "vminstancetypes", "vmf", "vmfs",
                                   "virtualmachineinstancetype",
                                   "virtualmachineinstancetypes"),
    "VirtualMachineClusterInstancetype": ("vmclusterinstancetype", "vmclusterinstancetypes",
                                          "vmcf", "vmcfs", "virtualmachineclusterinstancetype",
                                          "virtualmachineclusterinstancetypes"),
    "VirtualMachinePreference": ("vmpreference", "vmpreferences", "vmpref", "vmprefs", "vmp",
                                 "vmps", "virtualmachinepreference",
                                 "virtualmachinepreferences"),
    "VirtualMachineClusterPreference": ("vmclusterpreference", "vmclusterpreferences", "vmcp",
                                        "vmcps", "virtualmachineclusterpreference",
                                        "virtualmachineclusterpreferences"),
    "ControllerRevision": ("controllerrevision", "controllerrevisions"),
    "VirtualMachineInstancePreset": ("vmipreset", "vmipresets", "virtualmachineinstancepreset",
                                     "virtualmachineinstancepresets"),
    "VirtualMachineInstanceReplicaSet": ("vmirs", "vmirss", "virtualmachineinstancereplicaset",
                                         "virtualmachineinstancereplicasets"),
}
"""Kinds the read side serves, with the short names kubectl users type."""


def resolve_kind(text: str) -> str:
    for kind, aliases in KINDS.items():
        if text == kind or text.lower() in aliases:
            return kind
    names = ", ".join(a[0] for a in KINDS.values())
    raise InvalidSpec("kind", f"must be one of {names} (or their full names), not {text!r}")


KIND_TOKENS: Final = {
    "VirtualMachine": VM_KIND, "VirtualMachineInstance": VMI_KIND, "Node": NODE_KIND,
    "VirtualMachineInstanceMigration": MIGRATION_KIND, HCO_API_KIND: HCO_KIND,
    **OPERAND_TOKENS, **INSTANCETYPE_TOKENS, REVISION_KIND: REVISION_TOKEN,
    PRESET: PRESET_KIND, REPLICA_SET: REPLICA_SET_KIND}
"""Each kind's token in aggregate ids and subjects."""
TOKEN_KINDS: Final = {token: kind for kind, token in KIND_TOKENS.items()}
