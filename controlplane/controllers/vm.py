"""The VM controller: keeps each VirtualMachine's VMI in line with its run strategy.

| VM                                  | VMI                         | action              |
|-------------------------------------|-----------------------------|---------------------|
| wants running                       | none                        | create VMI          |
| wants running, Always               | Succeeded / Failed          | delete VMI (renew)  |
| wants running                       | older restart count         | delete VMI (renew)  |
| does not want running / deleted     | active, not being deleted   | delete VMI          |
| deleted                             | finished                    | delete VMI          |

Level-triggered on each VM and VMI, and on the KubeVirt CR (every VM again: admission by
feature gate depends on it).
"""

from __future__ import annotations

from typing import Final

from controlplane.controllers import derived_command
from controlplane.instancetype.revisions import referenced_versions
from events.codec import Event
from events.hco import OPERAND_TOKENS
from events.instancetype import KIND_TOKENS as INSTANCETYPE_TOKENS
from events.messages import Command
from events.subjects import aggregate_id, split_aggregate_id
from events.vm import VM_KIND, VMI_KIND
from projections.cluster import ClusterState
from projections.hco import operand
from projections.views import TERMINAL_PHASES, VirtualMachineView

NAME = "vm"
_KUBEVIRT: Final = OPERAND_TOKENS["KubeVirt"]


class VMController:
    name = NAME

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        kind, namespace, name = split_aggregate_id(event.originator_id)
        if kind == _KUBEVIRT or kind in INSTANCETYPE_TOKENS.values():
            # The effective configuration changed, or an instancetype or preference did: a
            # VMI refused for either may be created now, without waiting for its VM to change.
            return self.resync(state)
        if kind not in (VM_KIND, VMI_KIND):
            return []
        return self.reconcile(state, namespace, name, event.correlation_id)

    def resync(self, state: ClusterState) -> list[Command]:
        keys = {(v.metadata.namespace, v.metadata.name) for v in state.vms()}
        keys |= {(v.metadata.namespace, v.metadata.name) for v in state.vmis() if v.owner}
        return [c for ns, name in sorted(keys) for c in self.reconcile(state, ns, name)]

    def reconcile(self, state: ClusterState, namespace: str, name: str,
                  correlation_id: str = "") -> list[Command]:
        vm = state.vm(namespace, name)
        vmi = state.vmi(namespace, name)
        vm_version = vm.version if vm else 0
        if not correlation_id and vm is not None:
            correlation_id = vm.correlation_id  # a resync acts on the VM's last request
        # A deleted VMI's version still counts, so the command that replaces a finished VMI
        # differs from the one that created it.
        last = state.views.get(aggregate_id(VMI_KIND, namespace, name))
        vmi_version = last.version if last else 0
        # Creating a VMI also reads the effective KubeVirt configuration (feature gates, CPU
        # model): a refusal under one configuration is final for that command only.
        configuration = operand(state, "KubeVirt")
        kubevirt = configuration.version if configuration is not None else 0
        references = referenced_versions(state, vm) if vm is not None else []

        def command(verb: str) -> list[Command]:
            return [derived_command(NAME, "VirtualMachineInstance", verb, namespace, name,
                                    vm_version, vmi_version, kubevirt, *references,
                                    correlation_id=correlation_id)]

        if vmi is not None and not vmi.owner:
            return []  # a standalone VMI is the user's, not ours
        if vmi is not None and vmi.deletion_requested_at is not None:
            return []  # on its way out; wait for it
        if vm is None:
            return command("delete") if vmi is not None else []
        if not vm.wants_running:
            return command("delete") if vmi is not None and vmi.active else []
        if vmi is None:
            return command("create-for-vm")
        if self._should_renew(vm, vmi.phase, vmi.restart_count):
            return command("delete")
        return []

    @staticmethod
    def _should_renew(vm: VirtualMachineView, phase: str, restart_count: int) -> bool:
        if restart_count < vm.restart_count:
            return True
        return phase in TERMINAL_PHASES and vm.run_strategy == "Always"
