"""VirtualMachine commands: apply, start, stop, restart, delete.

What `start` / `stop` / `restart` do depends on the run strategy, as in KubeVirt:

| verb    | Always                  | Halted                   | Manual                          |
|---------|-------------------------|--------------------------|---------------------------------|
| start   | rejected (runs already) | runStrategy -> Always    | state change request Start      |
| stop    | runStrategy -> Halted   | rejected (not running)   | state change request Stop       |
| restart | VMI replaced            | rejected (not running)   | VMI replaced (if running)       |
"""

from __future__ import annotations

import uuid

from controlplane.aggregate import Aggregate
from controlplane.feature_gates import VM_METADATA_PATH, VM_SPEC_PATH, admit_by_feature_gates
from controlplane.handling import Decision, Rejected, handles
from events.api.vm import VirtualMachine
from events.subjects import aggregate_id
from events.vm import (
    VM_KIND,
    VMI_KIND,
    VirtualMachineCreated,
    VirtualMachineDeleted,
    VirtualMachineRestartRequested,
    VirtualMachineRunStrategyChanged,
    VirtualMachineStateChangeRequested,
    VirtualMachineUpdated,
)
from projections.views import VirtualMachineInstanceView, VirtualMachineView

KIND = "VirtualMachine"


def load_vm(d: Decision) -> Aggregate[VirtualMachineView]:
    return d.existing(VM_KIND, VirtualMachineView, "virtualmachine")


def vmi_running(d: Decision) -> bool:
    vmi = d.target(VMI_KIND, VirtualMachineInstanceView)
    return vmi.state.active and vmi.state.deletion_requested_at is None


@handles(KIND, "apply")
def apply(d: Decision) -> None:
    new = d.submitted(VirtualMachine)
    template = new.spec.template
    admit_by_feature_gates(d, template.spec, VM_SPEC_PATH, template.metadata.annotations,
                           VM_METADATA_PATH)
    meta = new.metadata
    vm = d.load(aggregate_id(VM_KIND, meta.namespace, meta.name), VirtualMachineView)
    if not vm.exists:
        d.trigger(vm, VirtualMachineCreated, uid=str(uuid.uuid4()), metadata=meta, spec=new.spec)
        return
    old = vm.state
    if old.spec == new.spec and old.metadata.labels == meta.labels \
            and old.metadata.annotations == meta.annotations:
        return
    generation = old.generation + (old.spec != new.spec)
    d.trigger(vm, VirtualMachineUpdated, metadata=meta, spec=new.spec, generation=generation)


@handles(KIND, "start")
def start(d: Decision) -> None:
    vm = load_vm(d)
    match vm.state.run_strategy:
        case "Always":
            raise Rejected("Always does not support manual start requests")
        case "Halted":
            d.trigger(vm, VirtualMachineRunStrategyChanged, run_strategy="Always",
                      generation=vm.state.generation + 1)
        case "Manual":
            if vmi_running(d):
                raise Rejected("VM is already running")
            d.trigger(vm, VirtualMachineStateChangeRequested, action="Start")
        case other:
            raise Rejected(f"runStrategy {other} does not support start")


@handles(KIND, "stop")
def stop(d: Decision) -> None:
    vm = load_vm(d)
    match vm.state.run_strategy:
        case "Always":
            d.trigger(vm, VirtualMachineRunStrategyChanged, run_strategy="Halted",
                      generation=vm.state.generation + 1)
        case "Halted":
            raise Rejected("VM is not running: Halted does not support manual stop requests")
        case "Manual":
            if not vmi_running(d) and not vm.state.manual_running:
                raise Rejected("VM is not running")
            d.trigger(vm, VirtualMachineStateChangeRequested, action="Stop")
        case other:
            raise Rejected(f"runStrategy {other} does not support stop")


@handles(KIND, "restart")
def restart(d: Decision) -> None:
    vm = load_vm(d)
    if vm.state.run_strategy == "Halted":
        raise Rejected("Halted does not support manual restart requests")
    if not vmi_running(d):
        raise Rejected("VM is not running")
    d.trigger(vm, VirtualMachineRestartRequested, restart_count=vm.state.restart_count + 1)


@handles(KIND, "delete")
def delete(d: Decision) -> None:
    vm = load_vm(d)
    d.trigger(vm, VirtualMachineDeleted)
