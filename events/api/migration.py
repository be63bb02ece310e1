"""kubevirt.io/v1 VirtualMachineInstanceMigration, as submitted by users (short name vmim)."""

from __future__ import annotations

from typing import Any, Final, Literal

from events.api.base import ApiStruct, ObjectMeta
from events.api.kinds import AGE, NAME, Column, Kind, at_path, declare
from events.api.vm import API_VERSION

KIND = "VirtualMachineInstanceMigration"


class MigrationSpec(ApiStruct):
    vmi_name: str = ""


class VirtualMachineInstanceMigration(ApiStruct):
    metadata: ObjectMeta
    spec: MigrationSpec
    api_version: str = API_VERSION
    kind: Literal["VirtualMachineInstanceMigration"] = "VirtualMachineInstanceMigration"
    status: dict[str, object] | None = None




def _progress(obj: dict[str, Any]) -> str:
    """How much of the guest's memory has been sent, as a percentage ('' before it is known)."""
    total = at_path(obj, ".status.progress.dataTotalBytes") or 0
    done = at_path(obj, ".status.progress.dataProcessedBytes") or 0
    return f"{100 * done // total}%" if total else ""


VIRTUAL_MACHINE_INSTANCE_MIGRATION: Final = declare(Kind(
    kind=KIND, group=API_VERSION.partition("/")[0], versions=("v1",),
    plural="virtualmachineinstancemigrations", token="vmim", short_names=("vmim", "vmims"),
    categories=("all",), manifest=VirtualMachineInstanceMigration,
    columns=(NAME, Column("PHASE", ".status.phase"), Column("VMI", ".spec.vmiName"),
             Column("SOURCE", ".status.migrationState.sourceNode"),
             Column("TARGET", ".status.migrationState.targetNode"),
             Column("PROGRESS", ".status.progress", value=_progress), AGE)))
