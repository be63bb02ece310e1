"""The read API's kinds and their short names. The query/answer messages themselves are in
`events.query`, since node agents ask too."""

from __future__ import annotations

from typing import Final

from events.errors import InvalidSpec

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
