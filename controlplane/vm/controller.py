"""The VM controller: keeps each VirtualMachine's VMI in line with its run strategy, as
KubeVirt's `syncRunStrategy` and `syncStartFailureStatus` do. First matching row wins:

| VM                                  | VMI                               | action              |
|-------------------------------------|-----------------------------------|---------------------|
| any                                 | standalone (no owner)             | none: the user's    |
| any                                 | being deleted                     | none: wait for it   |
| deleted                             | any                               | delete VMI          |
| Always / RerunOnFailure / Once,     | finished without ever running,    | start-failed (count |
| this VMI not counted yet            |                                   | it, back off)       |
| start failure recorded              | ran; or the strategy is Manual /  | start-failure-over  |
|                                     | Halted                            |                     |
| Halted                              | any                               | delete VMI          |
| any                                 | older restart count, or a Stop    | delete VMI          |
|                                     | request names it                  |                     |
| Always                              | Succeeded / Failed                | delete VMI (renew)  |
| RerunOnFailure, no Start request    | Failed                            | rerun (a Start      |
|                                     |                                   | request)            |
| RerunOnFailure                      | Succeeded / Failed                | delete VMI          |
| Manual / Once                       | any other                         | none                |
| Always / RerunOnFailure, backing    | none                              | none until          |
| off (now < retryAfter)              |                                   | retryAfter (`due`)  |
| Always / Once; Manual / Rerun with  | none                              | create VMI          |
| a Start request                     |                                   |                     |

Level-triggered on each VM and VMI, on the KubeVirt CR (every VM again: admission by
feature gate depends on it), on instancetypes, preferences and presets (what a VMI is made
from), and on the clock: `due` proposes the VMIs whose backoff ran out,
from the log's retryAfter and `clock`, so a restart (which reconciles everything) loses no
pending retry.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

from controlplane.controllers import derived_command
from controlplane.instancetype.revisions import referenced_versions
from events.language.codec import Event
from events.language.kinds.hco import OPERAND_TOKENS
from events.language.kinds.instancetype import KIND_TOKENS as INSTANCETYPE_TOKENS
from events.language.kinds.preset import PRESET_KIND
from events.language.kinds.vm import VM_KIND, VMI_KIND
from events.language.messages import Command
from events.language.subjects import aggregate_id, split_aggregate_id
from projections.cluster import ClusterState
from projections.hco import operand
from projections.kinds.vm import (
    RESTARTING_STRATEGIES,
    VirtualMachineInstanceView,
    VirtualMachineView,
)

NAME = "vm"
_KUBEVIRT: Final = OPERAND_TOKENS["KubeVirt"]
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class VMController:
    name = NAME

    def __init__(self, clock: Clock = utc_now) -> None:
        self.clock = clock

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        kind, namespace, name = split_aggregate_id(event.originator_id)
        if kind in (_KUBEVIRT, PRESET_KIND) or kind in INSTANCETYPE_TOKENS.values():
            # The effective configuration changed, or an instancetype, a preference or a
            # preset did: a VMI refused for one may be created now, without waiting for its
            # VM to change.
            return self.resync(state)
        if kind not in (VM_KIND, VMI_KIND):
            return []
        return self.reconcile(state, namespace, name, event.correlation_id)

    def resync(self, state: ClusterState) -> list[Command]:
        keys = {(v.metadata.namespace, v.metadata.name) for v in state.vms()}
        keys |= {(v.metadata.namespace, v.metadata.name) for v in state.vmis() if v.owner}
        return [c for ns, name in sorted(keys) for c in self.reconcile(state, ns, name)]

    def due(self, state: ClusterState) -> list[Command]:
        """The VMs without a VMI whose crash-loop backoff has run out by now."""
        now = self.clock()
        return [c for vm in state.vms()
                if vm.start_failure is not None and vm.start_failure.retry_after <= now
                and state.vmi(vm.metadata.namespace, vm.metadata.name) is None
                for c in self.reconcile(state, vm.metadata.namespace, vm.metadata.name)]

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
        presets = state.presets_seen(namespace)

        def command(kind: str, verb: str) -> list[Command]:
            return [derived_command(NAME, kind, verb, namespace, name,
                                    vm_version, vmi_version, kubevirt, presets, *references,
                                    correlation_id=correlation_id)]

        if vmi is not None and not vmi.owner:
            return []  # a standalone VMI is the user's, not ours
        if vmi is not None and vmi.deletion_requested_at is not None:
            return []  # on its way out; wait for it
        if vm is None:
            return command("VirtualMachineInstance", "delete") if vmi is not None else []
        if verb := self._start_failure_verb(vm, vmi):
            return command("VirtualMachine", verb)
        if vmi is None:
            return command("VirtualMachineInstance", "create-for-vm") \
                if vm.starts_without_vmi and not self._backing_off(vm) else []
        if verb := self._vmi_verb(vm, vmi):
            kind = "VirtualMachine" if verb == "rerun" else "VirtualMachineInstance"
            return command(kind, verb)
        return []

    @staticmethod
    def _start_failure_verb(vm: VirtualMachineView,
                            vmi: VirtualMachineInstanceView | None) -> str:
        """Count a VMI that never ran before anything replaces it; forget the count once one
        runs or the strategy restarts nothing."""
        restarting = vm.run_strategy in RESTARTING_STRATEGIES
        failure = vm.start_failure
        if vmi is not None and restarting and vmi.failed_early and (
                failure is None or failure.last_failed_vmi_uid != vmi.uid):
            return "start-failed"
        if failure is not None and (not restarting or (vmi is not None and vmi.has_run)):
            return "start-failure-over"
        return ""

    @staticmethod
    def _vmi_verb(vm: VirtualMachineView, vmi: VirtualMachineInstanceView) -> str:
        """What the VM's existing VMI needs: delete, rerun, or '' for nothing."""
        stop_requested = vmi.restart_count < vm.restart_count or vm.stop_requested_uid == vmi.uid
        match vm.run_strategy:
            case "Halted":
                return "delete"
            case _ if stop_requested:
                return "delete"
            case "Always":
                return "delete" if vmi.final else ""
            case "RerunOnFailure" if vmi.phase == "Failed" and not vm.start_requested:
                return "rerun"
            case "RerunOnFailure":
                return "delete" if vmi.final else ""
            case _:
                return ""

    def _backing_off(self, vm: VirtualMachineView) -> bool:
        """Waiting out a crash-loop backoff (Once, which never reruns, does not wait)."""
        return (vm.run_strategy in ("Always", "RerunOnFailure") and vm.start_failure is not None
                and self.clock() < vm.start_failure.retry_after)
