"""VirtualMachine commands: apply, start, stop, restart, delete, and the VM controller's.

What `start` / `stop` / `restart` do depends on the run strategy, as KubeVirt's virt-api
answers them (`pkg/virt-api/rest/lifecycle.go`); each refusal is KubeVirt's text:

| verb    | Always / Once           | Halted                    | Manual / RerunOnFailure    |
|---------|-------------------------|---------------------------|----------------------------|
| start   | "<rs> does not support  | runStrategy (or `running`)| a Start request; a finished|
|         | manual start requests"  | -> Always                 | VMI (Manual) or a Succeeded|
|         |                         |                           | one (Rerun) is stopped     |
|         |                         |                           | first; RerunOnFailure      |
|         |                         |                           | refuses a Failed VMI       |
| stop    | runStrategy (or         | "VM is not running", or   | a Stop request for the VMI;|
|         | `running`) -> Halted    | "Halted only supports     | "VM is not running" without|
|         |                         | manual stop requests with | a live VMI                 |
|         |                         | a shorter graceperiod"    |                            |
| restart | Always: VMI replaced;   | "RunStategy Halted does   | the VMI replaced           |
|         | Once: "RunStategy Once  | not support manual        |                            |
|         | does not support ..."   | restart requests"         |                            |

Before any of that, `start` refuses a VMI that is neither finished nor unprocessed ("VM is
already running"), and `restart` a VM without a VMI ("VM is not running: Halted"). A start,
stop or restart request is refused while another one waits ("unable to complete request:
stop/start already underway"; a lone stop replaces what waits), and clears
status.startFailure, as KubeVirt's `getChangeRequestJson` does.
"""

from __future__ import annotations

import random

from controlplane.aggregate import Aggregate
from controlplane.decision import Decision, Rejected, handles
from controlplane.defaults import (
    CRASH_LOOP_BACKOFF_MAX_DELAY_SECONDS,
    CRASH_LOOP_BACKOFF_MIN_INTERVAL_SECONDS,
)
from controlplane.feature_gates import VM_METADATA_PATH, VM_SPEC_PATH, admit_by_feature_gates
from controlplane.instancetype.revisions import admitted_vm, delete_revisions
from events.api.vm import VirtualMachine
from events.language.ids import random_uuid
from events.language.kinds.vm import (
    VM_KIND,
    VMI_KIND,
    StateChange,
    VirtualMachineCreated,
    VirtualMachineDeleted,
    VirtualMachineRestartRequested,
    VirtualMachineRunStrategyChanged,
    VirtualMachineStartFailed,
    VirtualMachineStartFailureCleared,
    VirtualMachineStateChangeRequested,
    VirtualMachineUpdated,
)
from events.language.subjects import aggregate_id
from projections.cluster import pending_state_changes
from projections.kinds.vm import (
    RESTARTING_STRATEGIES,
    VirtualMachineInstanceView,
    VirtualMachineView,
)

KIND = "VirtualMachine"


def load_vm(d: Decision) -> Aggregate[VirtualMachineView]:
    return d.existing(VM_KIND, VirtualMachineView, "virtualmachine")


def current_vmi(d: Decision) -> VirtualMachineInstanceView | None:
    """The VM's VMI, if there is one (running, finished or going away)."""
    vmi = d.target(VMI_KIND, VirtualMachineInstanceView)
    return vmi.state if vmi.exists else None


@handles(KIND, "apply")
def apply(d: Decision) -> None:
    submitted = d.submitted(VirtualMachine)
    template = submitted.spec.template
    admit_by_feature_gates(d, template.spec, VM_SPEC_PATH, template.metadata.annotations,
                           VM_METADATA_PATH)
    meta = submitted.metadata
    vm = d.load(aggregate_id(VM_KIND, meta.namespace, meta.name), VirtualMachineView)
    new = admitted_vm(d, submitted, vm.state)
    if not vm.exists:
        d.trigger(vm, VirtualMachineCreated, uid=random_uuid(), metadata=meta, spec=new.spec)
        return
    old = vm.state
    if old.spec == new.spec and old.metadata.labels == meta.labels \
            and old.metadata.annotations == meta.annotations:
        return
    generation = old.generation + (old.spec != new.spec)
    d.trigger(vm, VirtualMachineUpdated, metadata=meta, spec=new.spec, generation=generation)


def request_state_changes(d: Decision, vm: Aggregate[VirtualMachineView],
                          vmi: VirtualMachineInstanceView | None,
                          *changes: tuple[StateChange, str]) -> None:
    """Append (action, VMI uid) requests to status.stateChangeRequests as KubeVirt's
    `getChangeRequestJson` does: refused while others wait, unless a lone Stop replaces
    them; status.startFailure removed."""
    lone_stop = len(changes) == 1 and changes[0][0] == "Stop"
    if pending_state_changes(vm.state, vmi) and not lone_stop:
        raise Rejected("unable to complete request: stop/start already underway")
    for action, uid in changes:
        d.trigger(vm, VirtualMachineStateChangeRequested, action=action, uid=uid)
    clear_start_failure(d, vm)


def clear_start_failure(d: Decision, vm: Aggregate[VirtualMachineView]) -> None:
    if vm.state.start_failure is not None:
        d.trigger(vm, VirtualMachineStartFailureCleared)


@handles(KIND, "start")
def start(d: Decision) -> None:
    vm = load_vm(d)
    vmi = current_vmi(d)
    if vmi is not None and not vmi.final and vmi.phase not in ("", "Unknown"):
        raise Rejected("VM is already running")
    match rs := vm.state.run_strategy:
        case "Halted":
            d.trigger(vm, VirtualMachineRunStrategyChanged, run_strategy="Always",
                      generation=vm.state.generation + 1)
        case "Manual" | "RerunOnFailure":
            if rs == "RerunOnFailure" and vmi is not None and vmi.phase == "Failed":
                raise Rejected("RerunOnFailure does not support starting VM from failed state")
            finished = "Succeeded" if rs == "RerunOnFailure" else ("Succeeded", "Failed")
            if vmi is not None and vmi.phase in finished:
                request_state_changes(d, vm, vmi, ("Stop", vmi.uid), ("Start", ""))
            else:
                request_state_changes(d, vm, vmi, ("Start", ""))
        case _:
            raise Rejected(f"{rs} does not support manual start requests")


@handles(KIND, "stop")
def stop(d: Decision) -> None:
    vm = load_vm(d)
    vmi = current_vmi(d)
    live = vmi is not None and not vmi.final
    match vm.state.run_strategy:
        case "Always" | "Once":
            d.trigger(vm, VirtualMachineRunStrategyChanged, run_strategy="Halted",
                      generation=vm.state.generation + 1)
        case "Halted":
            if vmi is None or not live:
                raise Rejected("VM is not running")
            grace = d.command.grace_period_seconds
            current = vmi.spec.termination_grace_period_seconds if vmi.spec else None
            if grace is None or (current is not None and grace >= current):
                raise Rejected("Halted only supports manual stop requests with a shorter "
                               "graceperiod")
            raise Rejected("shortening the grace period of a stopping VM is not supported "
                           "yet")
        case _:
            if vmi is None or not live:
                raise Rejected("VM is not running")
            request_state_changes(d, vm, vmi, ("Stop", vmi.uid))


@handles(KIND, "restart")
def restart(d: Decision) -> None:
    """A Stop of the VMI and a Start, as one request (`restart_count` names the VMI it
    replaces)."""
    vm = load_vm(d)
    rs = vm.state.run_strategy
    if rs in ("Halted", "Once"):
        raise Rejected(f"RunStategy {rs} does not support manual restart requests")
    vmi = current_vmi(d)
    if vmi is None:
        raise Rejected("VM is not running: Halted")
    if pending_state_changes(vm.state, vmi):
        raise Rejected("unable to complete request: stop/start already underway")
    d.trigger(vm, VirtualMachineRestartRequested, restart_count=vm.state.restart_count + 1)
    clear_start_failure(d, vm)


@handles(KIND, "delete")
def delete(d: Decision) -> None:
    vm = load_vm(d)
    delete_revisions(d, vm.state)
    d.trigger(vm, VirtualMachineDeleted)


# -- the VM controller's: start failures and reruns ------------------------------------------


def crash_loop_delay_seconds(fail_count: int, jitter_seed: str) -> int:
    """KubeVirt's `calculateStartBackoffTime`: interval x failures², plus up to half again at
    random (seeded here, so the same failure gets the same delay), capped."""
    interval = max(CRASH_LOOP_BACKOFF_MAX_DELAY_SECONDS // 30,
                   CRASH_LOOP_BACKOFF_MIN_INTERVAL_SECONDS)
    delay = interval * max(fail_count, 1) ** 2
    delay += random.Random(jitter_seed).randrange(delay // 2 + 1)
    return min(delay, CRASH_LOOP_BACKOFF_MAX_DELAY_SECONDS)


@handles(KIND, "start-failed", internal=True)
def start_failed(d: Decision) -> None:
    """The VMI finished without running: one more consecutive start failure (KubeVirt's
    `syncStartFailureStatus`), counted once per VMI."""
    vm = load_vm(d)
    vmi = current_vmi(d)
    failure = vm.state.start_failure
    if vmi is None or not vmi.failed_early or vm.state.run_strategy not in RESTARTING_STRATEGIES:
        raise Rejected("no start failure to count")
    if failure is not None and failure.last_failed_vmi_uid == vmi.uid:
        raise Rejected("this VMI's start failure is counted already")
    count = failure.consecutive_fail_count + 1 if failure is not None else 1
    d.trigger(vm, VirtualMachineStartFailed, vmi_uid=vmi.uid, consecutive_fail_count=count,
              delay_seconds=crash_loop_delay_seconds(count, f"{vmi.uid}:{count}"))


@handles(KIND, "start-failure-over", internal=True)
def start_failure_over(d: Decision) -> None:
    """A VMI of the VM ran, or the strategy restarts nothing: the backoff starts over."""
    vm = load_vm(d)
    vmi = current_vmi(d)
    ran = vmi is not None and vmi.has_run
    if vm.state.start_failure is None or not (
            ran or vm.state.run_strategy not in RESTARTING_STRATEGIES):
        raise Rejected("no start failure to forget")
    clear_start_failure(d, vm)


@handles(KIND, "rerun", internal=True)
def rerun(d: Decision) -> None:
    """RerunOnFailure's VMI failed: a Start request, so the next VMI follows its deletion."""
    vm = load_vm(d)
    vmi = current_vmi(d)
    if vm.state.run_strategy != "RerunOnFailure" or vmi is None or vmi.phase != "Failed" \
            or vm.state.start_requested:
        raise Rejected("no longer needed")
    d.trigger(vm, VirtualMachineStateChangeRequested, action="Start")
