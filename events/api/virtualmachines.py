"""VirtualMachine and VirtualMachineInstance, declared: their admission is KubeVirt's VM and
VMI webhooks (the VMI spec rules of `events.api.validation`), which the schema module
(`events.api.vm`) sits below."""

from __future__ import annotations

from typing import Final

from events.api.errors import InvalidSpec
from events.api.kinds import AGE, NAME, Column, Kind, at_path, declare
from events.api.validation import validate_vmi_spec
from events.api.vm import (
    API_VERSION,
    RUN_STRATEGIES,
    SUPPORTED_RUN_STRATEGIES,
    VirtualMachine,
    VirtualMachineInstance,
)


def validate_vm(vm: VirtualMachine) -> None:
    """KubeVirt's VM webhook: a run strategy it supports, and (unless an instancetype or a
    preference completes it later, in the control plane) a template that is a valid VMI."""
    _validate_run_strategy(vm)
    if vm.spec.instancetype is None and vm.spec.preference is None:
        validate_vmi_spec(vm.spec.template.spec, "spec.template.spec")


def validate_vmi(vmi: VirtualMachineInstance) -> None:
    validate_vmi_spec(vmi.spec, "spec")


def _validate_run_strategy(vm: VirtualMachine) -> None:
    spec = vm.spec
    if spec.running is not None and spec.run_strategy is not None:
        raise InvalidSpec("spec.running", "cannot be set together with spec.runStrategy")
    if spec.effective_run_strategy not in RUN_STRATEGIES:
        raise InvalidSpec("spec.runStrategy",
                          f"must be one of {', '.join(RUN_STRATEGIES)}, not {spec.run_strategy!r}")
    if spec.effective_run_strategy not in SUPPORTED_RUN_STRATEGIES:
        raise InvalidSpec(
            "spec.runStrategy",
            f"must be one of {', '.join(SUPPORTED_RUN_STRATEGIES)} "
            f"(others are not supported yet), not {spec.run_strategy!r}",
        )


KUBEVIRT_GROUP: Final = API_VERSION.partition("/")[0]
PHASE: Final = Column("PHASE", ".status.phase")

VIRTUAL_MACHINE: Final = declare(Kind(
    kind="VirtualMachine", group=KUBEVIRT_GROUP, versions=("v1",), plural="virtualmachines",
    token="vm", short_names=("vm", "vms"), categories=("all",), manifest=VirtualMachine,
    validate=validate_vm,
    subresources=("status", "start", "stop", "restart", "migrate"),
    columns=(NAME, AGE, Column("STATUS", ".status.printableStatus"),
             Column("READY", ".status.ready", "boolean",
                    value=lambda o: bool(at_path(o, ".status.ready"))))))
VIRTUAL_MACHINE_INSTANCE: Final = declare(Kind(
    kind="VirtualMachineInstance", group=KUBEVIRT_GROUP, versions=("v1",),
    plural="virtualmachineinstances", token="vmi", short_names=("vmi", "vmis"),
    categories=("all",), manifest=VirtualMachineInstance, validate=validate_vmi,
    subresources=("status", "pause", "unpause", "softreboot", "console"),
    columns=(NAME, AGE, PHASE, Column("NODENAME", ".status.nodeName"),
             Column("READY", ".status.phase", "boolean",
                    value=lambda o: at_path(o, ".status.phase") == "Running"))))
