"""Run strategies, start failures and printableStatus on the real store: commands in (users',
the VM controller's and scheduler's as the control loop proposes them, nodes' reports),
events and read models out. The VM controller reads a clock the test moves, so a crash-loop
backoff is waited out without waiting."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from controlplane.controllers.scheduler import Scheduler
from controlplane.defaults import CRASH_LOOP_BACKOFF_MAX_DELAY_SECONDS
from controlplane.vm.commands import crash_loop_delay_seconds
from controlplane.vm.controller import VMController
from events.language.messages import Command, DomainObservation, node_actor
from events.language.subjects import Layout
from projections.cluster import ClusterState, printable_status, render_vm
from projections.kinds.vm import MigrationState
from tests.store.helpers import SyncHandler, register_command, replayed, run, run_accepted
from tests.system.harness import vm_manifest

NODE = "n1"


class Cluster:
    """One node, the VM controller on a movable clock, the scheduler; `settle` runs their
    proposals until they propose nothing new, as the control loop would."""

    def __init__(self, handler: SyncHandler, prefix: str) -> None:
        self.handler = handler
        self.layout = Layout(prefix)
        self.state = ClusterState()
        self.shift = timedelta()
        self.vms = VMController(clock=self.now)
        self.run(register_command(NODE))

    def now(self) -> datetime:
        return datetime.now(UTC) + self.shift

    def run(self, command: Command) -> Any:
        return run(self.handler, self.state, command).outcome

    def user(self, verb: str, name: str, manifest: dict[str, Any] | None = None) -> Any:
        return self.run(Command(id=str(uuid.uuid4()), actor="user:erin", kind="VirtualMachine",
                                verb=verb, namespace="default", name=name, manifest=manifest))

    def apply(self, name: str, strategy: str = "Always", memory: str = "64Mi",
              **spec: Any) -> None:
        manifest = vm_manifest(name, strategy, memory)
        manifest["spec"].update(spec)
        if "running" in spec:
            del manifest["spec"]["runStrategy"]
        assert self.user("apply", name, manifest).accepted

    def settle(self, proposals: list[Command] | None = None) -> None:
        """Execute the controllers' proposals until a round appends nothing."""
        for _ in range(20):
            commands = proposals if proposals is not None else [
                *self.vms.resync(self.state), *Scheduler().resync(self.state)]
            proposals = None
            if not any(run(self.handler, self.state, c).events for c in commands):
                return
        raise AssertionError("the controllers did not settle")

    def report(self, name: str, phase: str, *, gone: bool = False) -> None:
        """The node's report of the VMI's domain."""
        vmi = self.state.vmi("default", name)
        assert vmi is not None
        obs = DomainObservation(namespace="default", name=name, uid=vmi.uid, phase=phase,
                                gone=gone)
        run_accepted(self.handler, self.state, Command(
            id=str(uuid.uuid4()), actor=node_actor(NODE), kind="VirtualMachineInstance",
            verb="observe", namespace="default", name=name, manifest=msgspec.to_builtins(obs)))

    def vm(self, name: str) -> dict[str, Any]:
        view = self.state.vm("default", name)
        assert view is not None
        return render_vm(view, self.state.vmi("default", name))

    def uid(self, name: str) -> str:
        vmi = self.state.vmi("default", name)
        return vmi.uid if vmi is not None else ""

    def fail_to_start(self, name: str) -> str:
        """The VMI's domain vanishes before it ever runs; its uid."""
        uid = self.uid(name)
        self.report(name, "Scheduled", gone=True)
        self.settle()
        return uid

    def replayed(self) -> ClusterState:
        return replayed(self.handler, self.layout)


@pytest.fixture
def cluster(handler: SyncHandler, prefix: str) -> Cluster:
    return Cluster(handler, prefix)


def status(cluster: Cluster, name: str) -> str:
    return str(cluster.vm(name)["status"]["printableStatus"])


def test_backoff_grows_is_capped_and_shown_as_crash_loop(cluster: Cluster) -> None:
    cluster.apply("crash")
    cluster.settle()
    assert status(cluster, "crash") == "Starting"
    first = cluster.fail_to_start("crash")

    vm = cluster.vm("crash")
    failure = vm["status"]["startFailure"]
    assert failure["consecutiveFailCount"] == 1 and failure["lastFailedVMIUID"] == first
    assert vm["status"]["printableStatus"] == "CrashLoopBackOff"
    assert cluster.state.vmi("default", "crash") is None  # no new VMI while backing off
    view = cluster.state.vm("default", "crash")
    assert view is not None and view.start_failure is not None
    waited = view.start_failure.retry_after - view.updated_at  # type: ignore[operator]
    assert timedelta(seconds=10) <= waited <= timedelta(seconds=15)  # 10 s, plus up to half

    assert cluster.vms.due(cluster.state) == []  # not yet
    cluster.shift = view.start_failure.retry_after - datetime.now(UTC)
    cluster.settle(cluster.vms.due(cluster.state))
    assert cluster.uid("crash") not in ("", first)
    assert status(cluster, "crash") == "Starting"  # a VMI again: no longer CrashLoopBackOff

    cluster.fail_to_start("crash")
    view = cluster.state.vm("default", "crash")
    assert view is not None and view.start_failure is not None
    assert view.start_failure.consecutive_fail_count == 2
    assert view.start_failure.retry_after - view.updated_at >= timedelta(seconds=40)  # type: ignore[operator]
    # The delay keeps growing with the square of the failures, up to KubeVirt's cap.
    delays = [crash_loop_delay_seconds(n, "seed") for n in range(1, 8)]
    assert delays == sorted(delays) and delays[-1] == CRASH_LOOP_BACKOFF_MAX_DELAY_SECONDS


def test_a_stable_run_resets_the_backoff(cluster: Cluster) -> None:
    cluster.apply("flaky")
    cluster.settle()
    cluster.fail_to_start("flaky")
    view = cluster.state.vm("default", "flaky")
    assert view is not None and view.start_failure is not None
    cluster.shift = view.start_failure.retry_after - datetime.now(UTC)
    cluster.settle(cluster.vms.due(cluster.state))
    cluster.settle()
    cluster.report("flaky", "Running")
    cluster.settle()
    assert "startFailure" not in cluster.vm("flaky")["status"]
    assert status(cluster, "flaky") == "Running"
    # It crashes after running: not a start failure, so it is replaced at once.
    crashed = cluster.uid("flaky")
    cluster.report("flaky", "Failed", gone=True)
    cluster.settle()
    assert cluster.uid("flaky") not in ("", crashed)
    assert "startFailure" not in cluster.vm("flaky")["status"]


def test_a_pending_retry_survives_a_control_plane_restart(cluster: Cluster) -> None:
    cluster.apply("phoenix")
    cluster.settle()
    cluster.fail_to_start("phoenix")
    view = cluster.state.vm("default", "phoenix")
    assert view is not None and view.start_failure is not None
    retry_after = view.start_failure.retry_after

    # A new control plane: the read model from the log, a controller with no memory.
    state = cluster.replayed()
    restarted = VMController(clock=cluster.now)
    assert restarted.resync(state) == [] and restarted.due(state) == []
    cluster.shift = retry_after - datetime.now(UTC)
    [create] = restarted.due(state)
    assert create.verb == "create-for-vm"
    cluster.state = state
    cluster.settle([create])
    assert cluster.uid("phoenix")


def test_rerun_on_failure_reruns_a_failed_vmi_not_a_succeeded_one(cluster: Cluster) -> None:
    cluster.apply("job", "RerunOnFailure")
    cluster.settle()
    cluster.report("job", "Running")
    failed = cluster.uid("job")
    cluster.report("job", "Failed", gone=True)
    cluster.settle()
    assert cluster.uid("job") not in ("", failed)
    cluster.report("job", "Running")
    cluster.report("job", "Succeeded", gone=True)
    cluster.settle()
    assert cluster.state.vmi("default", "job") is None
    assert status(cluster, "job") == "Stopped"
    # A user's start runs it again.
    assert cluster.user("start", "job").accepted
    cluster.settle()
    assert cluster.uid("job")


def test_once_never_runs_again_whatever_the_outcome(cluster: Cluster) -> None:
    for name, outcome in (("once-ok", "Succeeded"), ("once-bad", "Failed")):
        cluster.apply(name, "Once")
        cluster.settle()
        cluster.report(name, "Running")
        uid = cluster.uid(name)
        cluster.report(name, outcome, gone=True)
        cluster.settle()
        vmi = cluster.state.vmi("default", name)
        assert vmi is not None and (vmi.uid, vmi.phase) == (uid, outcome)
        assert status(cluster, name) == "Stopped"
        refused = cluster.user("start", name)
        assert refused.reason == "Once does not support manual start requests"
        refused = cluster.user("restart", name)
        assert refused.reason == "RunStategy Once does not support manual restart requests"


def test_start_stop_restart_per_strategy_as_kubevirt_answers(cluster: Cluster) -> None:
    for strategy in ("Always", "Halted", "Manual", "RerunOnFailure", "Once"):
        cluster.apply(strategy.lower(), strategy)
    cluster.settle()

    def answer(verb: str, name: str) -> str:
        outcome = cluster.user(verb, name)
        cluster.settle()
        return "accepted" if outcome.accepted else str(outcome.reason)

    assert answer("start", "always") == "VM is already running"
    assert answer("start", "halted") == "accepted"
    assert answer("stop", "halted") == "accepted"  # it is Always now: runStrategy -> Halted
    assert answer("stop", "halted") == \
        "Halted only supports manual stop requests with a shorter graceperiod"
    forced = cluster.run(Command(id=str(uuid.uuid4()), actor="user:erin",
                                 kind="VirtualMachine", verb="stop", namespace="default",
                                 name="halted", grace_period_seconds=0))
    assert forced.reason == "shortening the grace period of a stopping VM is not supported yet"
    cluster.report("halted", "Succeeded", gone=True)  # its node stopped it
    assert answer("stop", "halted") == "VM is not running"
    assert answer("restart", "halted") == \
        "RunStategy Halted does not support manual restart requests"

    assert answer("stop", "manual") == "VM is not running"
    assert answer("restart", "manual") == "VM is not running: Halted"
    assert answer("start", "manual") == "accepted"
    assert answer("start", "manual") == "VM is already running"
    first = cluster.uid("manual")
    assert answer("restart", "manual") == "accepted"
    cluster.report("manual", "Succeeded", gone=True)
    cluster.settle()
    assert cluster.uid("manual") not in ("", first)
    assert answer("stop", "manual") == "accepted"
    cluster.report("manual", "Succeeded", gone=True)
    assert cluster.state.vmi("default", "manual") is None
    assert cluster.vm("manual")["spec"]["runStrategy"] == "Manual"

    assert answer("start", "rerunonfailure") == "VM is already running"
    assert answer("stop", "rerunonfailure") == "accepted"
    cluster.report("rerunonfailure", "Succeeded", gone=True)
    cluster.settle()
    assert cluster.state.vmi("default", "rerunonfailure") is None
    assert cluster.vm("rerunonfailure")["spec"]["runStrategy"] == "RerunOnFailure"

    assert answer("stop", "once") == "accepted"
    assert cluster.vm("once")["spec"]["runStrategy"] == "Halted"
    # A second request while the first waits is refused.
    cluster.report("always", "Running")
    assert cluster.user("restart", "always").accepted
    assert cluster.user("restart", "always").reason == \
        "unable to complete request: stop/start already underway"


def test_running_is_kept_in_the_form_the_user_wrote(cluster: Cluster) -> None:
    cluster.apply("legacy", running=True)
    cluster.settle()
    assert cluster.user("stop", "legacy").accepted
    spec = cluster.vm("legacy")["spec"]
    assert spec["running"] is False and "runStrategy" not in spec
    cluster.settle()
    cluster.report("legacy", "Succeeded", gone=True)
    assert cluster.user("start", "legacy").accepted
    spec = cluster.vm("legacy")["spec"]
    assert spec["running"] is True and "runStrategy" not in spec


def test_printable_status_follows_kubevirts_order(cluster: Cluster) -> None:
    cluster.apply("web")
    assert status(cluster, "web") == "Stopped"  # applied, the controller not yet run
    cluster.settle([*cluster.vms.resync(cluster.state)])
    assert status(cluster, "web") == "Starting"  # Pending, not yet scheduled
    cluster.settle()
    cluster.report("web", "Running")
    assert status(cluster, "web") == "Running"
    vmi = cluster.state.vmi("default", "web")
    assert vmi is not None
    paused, migrating = vmi.copy(), vmi.copy()
    paused.paused_reason = "PausedUserRequested"
    migrating.migration = MigrationState(  # a migration in flight, as its events fold it
        migration_uid="m", migration_name="m", source_node="n1", target_node="n2",
        start=datetime.now(UTC))
    vm = cluster.state.vm("default", "web")
    assert vm is not None
    assert printable_status(vm, paused) == "Paused"
    assert printable_status(vm, migrating) == "Migrating"
    assert cluster.user("stop", "web").accepted
    cluster.settle([*cluster.vms.resync(cluster.state)])
    assert status(cluster, "web") == "Stopping"  # deletion asked, the node not yet done


def test_no_node_fits_is_error_unschedulable(cluster: Cluster) -> None:
    cluster.apply("huge", memory="1Ti")
    cluster.settle()
    assert status(cluster, "huge") == "ErrorUnschedulable"


def test_switching_to_rerun_on_failure_starts_the_vm(cluster: Cluster) -> None:
    """KubeVirt starts a RerunOnFailure VM whose strategy just changed to it, as a new one."""
    cluster.apply("batch", "Halted")
    cluster.settle()
    assert cluster.state.vmi("default", "batch") is None
    cluster.apply("batch", "RerunOnFailure")
    cluster.settle()
    assert cluster.uid("batch")
    assert "stateChangeRequests" not in cluster.vm("batch")["status"]  # the Start was met
