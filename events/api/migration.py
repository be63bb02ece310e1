"""kubevirt.io/v1 VirtualMachineInstanceMigration, as submitted by users (short name vmim)."""

from __future__ import annotations

from typing import Literal

from events.api.base import ApiStruct, ObjectMeta
from events.api.manifest import register_kind
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


register_kind(KIND, API_VERSION, VirtualMachineInstanceMigration)
