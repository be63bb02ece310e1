"""Live migration between two agents, on real NATS, each agent on a simulated host of its
own (a `sim_state` file), fed node work through its own queue as the dispatcher feeds it:
the target prepares, the source transfers and converges (or is aborted, or switches to
post-copy), the target starts the guest on finish and the source removes its copy on
cleanup without a word; a source killed mid-transfer reports it failed when it comes back,
and a target that comes back after Succeeded starts the guest rather than report it missing.
Work that names the wrong node, no order, or a guest that is not here is rejected."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import libvirt
import msgspec
import pytest
from nats.js.client import JetStreamContext

from events.language.messages import (
    SIMULATED_DIRTY_RATE_ANNOTATION,
    DomainObservation,
    MigrationObservation,
    MigrationOrder,
    NodeCommand,
    NodeReport,
    NodeVerb,
    SimRequest,
    node_actor,
)
from nodeagent.__main__ import main as agent_main
from nodeagent.defaults import DOMAIN_MISSING_REASON, SOURCE_RESTARTED_REASON
from nodeagent.migrating import ABORTED_REASON
from nodeagent.migration import SOURCE_LOST_DOMAIN_REASON
from nodeagent.vmiref import VMIRef
from tests.nodeagent.helpers import SPEC, WAIT_SECONDS, Cluster, Running, start
from tests.nodeagent.test_work import publish, worked_through

MiB = 1 << 20
FAST = {"migration_report_seconds": 0.05, "sim_migration_bandwidth": 64 * MiB}
"""A 64Mi guest goes over in about a second, reported every 50 ms."""


def vmi(ref: VMIRef, dirty_rate: str = "") -> dict[str, Any]:
    annotations = {SIMULATED_DIRTY_RATE_ANNOTATION: dirty_rate} if dirty_rate else {}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid,
                         "annotations": annotations},
            "spec": SPEC}


def work(verb: NodeVerb, ref: VMIRef, order: MigrationOrder | None,
         manifest: dict[str, Any] | None = None) -> NodeCommand:
    return NodeCommand(event_id=str(uuid.uuid4()), verb=verb, namespace=ref.namespace,
                       name=ref.name, uid=ref.uid, vmi=manifest, migration=order,
                       correlation_id=f"corr-{verb}")


def migration_report(node: str, state: str, **fields: Any) -> Callable[[NodeReport], bool]:
    def match(report: NodeReport) -> bool:
        obs = report.migration
        return report.node == node and obs is not None and obs.state == state and all(
            getattr(obs, k) == v for k, v in fields.items())

    return match


async def reports_until(sub: JetStreamContext.PullSubscription,
                        match: Callable[[NodeReport], bool]) -> list[NodeReport]:
    """Every report read, up to and with the first that `match`es."""
    seen: list[NodeReport] = []
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            msgs = await sub.fetch(16, timeout=1.0)
        except TimeoutError:
            continue
        for msg in msgs:
            await msg.ack()
            seen.append(msgspec.msgpack.decode(msg.data, type=NodeReport))
            if match(seen[-1]):
                return seen
    raise AssertionError(f"no matching report among {seen}")


async def next_report(sub: JetStreamContext.PullSubscription,
                      match: Callable[[NodeReport], bool]) -> NodeReport:
    return (await reports_until(sub, match))[-1]


async def fence(cluster: Cluster, sub: JetStreamContext.PullSubscription) -> list[NodeReport]:
    """Every report up to a marker published now: what the agents said before it (each
    reports before it acknowledges the work that made it say so)."""
    marker = NodeReport(id=str(uuid.uuid4()), node=cluster.node, kind="node")
    await cluster.nc.jetstream().publish(cluster.layout.report_subject(cluster.node, "node"),
                                         msgspec.msgpack.encode(marker))
    return (await reports_until(sub, lambda r: r.id == marker.id))[:-1]


def guests(running: Running) -> dict[str, int]:
    """uid to libvirt state of the guests on the agent's own host."""
    return {d.uid: d.state for d in running.agent.guests.summaries()}


class Pair:
    """A source and a target node, each with an agent on its own simulated host."""

    def __init__(self, cluster: Cluster, nats_url: str, tmp_path: Path) -> None:
        self.source = cluster
        self.target = Cluster(cluster.nc, cluster.writer, cluster.layout, f"{cluster.node}-t")
        self.nats_url = nats_url
        self.tmp_path = tmp_path

    def state(self, cluster: Cluster) -> str:
        return str(self.tmp_path / f"{cluster.node}.xml")

    async def agent(self, cluster: Cluster, **options: Any) -> Running:
        return await start(cluster, self.nats_url, sim_state=self.state(cluster),
                           **{**FAST, **options})

    def order(self, **limits: Any) -> MigrationOrder:
        return MigrationOrder(uid=str(uuid.uuid4()), name="mig", source_node=self.source.node,
                              target_node=self.target.node, **limits)


@pytest.fixture
def pair(cluster: Cluster, nats_url: str, tmp_path: Path) -> Pair:
    return Pair(cluster, nats_url, tmp_path)


async def do(cluster: Cluster, running: Running, command: NodeCommand) -> None:
    """Put `command` on the node's queue and wait until the agent has acknowledged it."""
    await worked_through(cluster, running, await publish(cluster, command))


async def reports_of(cluster: Cluster) -> JetStreamContext.PullSubscription:
    return await cluster.nc.jetstream().pull_subscribe(cluster.layout.reports_filter,
                                                       stream=cluster.layout.reports_stream)


async def launched(pair: Pair, source: Running, name: str) -> VMIRef:
    ref = await pair.source.placed(name)
    await source.agent.work.execute(pair.source.launch(ref), ref)
    return ref


async def test_a_guest_moves_prepare_migrate_finish_cleanup(pair: Pair) -> None:
    reports = await reports_of(pair.source)
    source = await pair.agent(pair.source)
    target = await pair.agent(pair.target)
    try:
        ref = await launched(pair, source, "mover")
        order = pair.order()

        await do(pair.target, target, work("migrate-prepare", ref, order, vmi(ref)))
        ready = await next_report(reports, migration_report(pair.target.node, "target-ready"))
        assert ready.migration is not None and ready.migration.migration_uid == order.uid
        assert ready.correlation_id == "corr-migrate-prepare"
        assert guests(target) == {}, "prepared, not started"
        assert ref.uid in target.agent.guests.ledger.holders(), "its devices are held for it"

        await do(pair.source, source, work("migrate", ref, order, vmi(ref)))
        seen = await reports_until(reports, migration_report(pair.source.node, "converged"))
        told = [r for r in seen if r.migration and r.node == pair.source.node]
        states = [r.migration.state for r in told if r.migration]
        assert states[0] == "running" and "progress" in states
        assert {r.correlation_id for r in told} == {"corr-migrate"}, "the request's, to the end"
        progress = next(r.migration for r in seen if r.migration
                        and r.migration.state == "progress")
        assert progress.data_total == 64 * MiB
        assert progress.data_processed > 0
        assert progress.data_remaining < 64 * MiB
        assert guests(source) == {ref.uid: libvirt.VIR_DOMAIN_RUNNING}, "still the source's"
        assert source.agent.migrations.book.outgoing[ref.uid].converged

        await do(pair.target, target, work("migrate-finish", ref, order))
        assert guests(target) == {ref.uid: libvirt.VIR_DOMAIN_RUNNING}
        assert target.agent.migrations.book.incoming == {}
        await do(pair.target, target, work("migrate-finish", ref, order))  # idempotent
        assert guests(target) == {ref.uid: libvirt.VIR_DOMAIN_RUNNING}

        await do(pair.source, source, work("migrate-cleanup", ref, order))
        assert guests(source) == {}
        assert source.agent.migrations.book.outgoing == {}
        said = [r.domain for r in await fence(pair.source, reports) if r.node == pair.source.node]
        assert not any(d and d.uid == ref.uid and d.gone for d in said), \
            "the source does not report the guest it handed over gone"
        assert await source.agent.worklog.migrations() == source.agent.migrations.book
    finally:
        await source.close()
        await target.close()


async def test_an_abort_stops_the_transfer_and_the_guest_stays(pair: Pair) -> None:
    """A guest dirtying as fast as the link: the transfer runs on after its work item is
    acknowledged, until the abort; then it is failed "aborted" and the guest stays."""
    reports = await reports_of(pair.source)
    source = await pair.agent(pair.source)
    try:
        ref = await launched(pair, source, "stuck")
        order = pair.order(progress_timeout_seconds=3600)
        await do(pair.source, source, work("migrate", ref, order, vmi(ref, "64Mi")))
        assert ref.uid in source.agent.migrations.transfers, "acknowledged while it transfers"
        await next_report(reports, migration_report(pair.source.node, "progress"))

        await do(pair.source, source, work("migrate-abort", ref, order))
        await next_report(reports, migration_report(pair.source.node, "failed",
                                                    reason=ABORTED_REASON))
        assert source.agent.migrations.transfers == {}
        assert source.agent.migrations.book.outgoing == {}
        assert guests(source) == {ref.uid: libvirt.VIR_DOMAIN_RUNNING}
        await do(pair.source, source, work("migrate-abort", ref, order))  # idempotent
        after = [r.migration for r in await fence(pair.source, reports) if r.migration]
        assert not any(m.state == "failed" for m in after), "aborted once"
    finally:
        await source.close()


async def test_an_abort_that_comes_after_convergence_leaves_the_copy_to_the_cleanup(
        pair: Pair) -> None:
    """A cancel raced the convergence: the cluster heard `converged` first (Succeeded),
    then the abort it had dispatched arrives, then the cleanup. The source's copy goes;
    and after a migration that ended so, the next one of the VMI goes ahead."""
    reports = await reports_of(pair.source)
    source = await pair.agent(pair.source)
    try:
        ref = await launched(pair, source, "raced")
        order = pair.order()
        await do(pair.source, source, work("migrate", ref, order, vmi(ref)))
        await next_report(reports, migration_report(pair.source.node, "converged"))
        await do(pair.source, source, work("migrate-abort", ref, order))
        assert not any(r.migration and r.migration.state == "failed"
                       for r in await fence(pair.source, reports)), "it did converge"
        await do(pair.source, source, work("migrate-cleanup", ref, order))
        assert guests(source) == {}, "the guest runs on the target only"
        assert source.agent.migrations.book.outgoing == {}

        again = await launched(pair, source, "again")
        first = pair.order()
        await do(pair.source, source, work("migrate", again, first, vmi(again)))
        await next_report(reports, migration_report(pair.source.node, "converged"))
        await do(pair.source, source, work("migrate-abort", again, first))  # then Failed
        second = pair.order()
        await do(pair.source, source, work("migrate", again, second, vmi(again)))
        await next_report(reports, migration_report(pair.source.node, "converged",
                                                    migration_uid=second.uid))
    finally:
        await source.close()


async def test_past_its_completion_timeout_a_transfer_switches_to_post_copy(pair: Pair) -> None:
    """The VMI's annotation makes the guest out-dirty the link: stuck in pre-copy, then
    post-copy at the completion timeout, which drains and converges."""
    reports = await reports_of(pair.source)
    source = await pair.agent(pair.source)
    try:
        ref = await launched(pair, source, "busy")
        order = pair.order(progress_timeout_seconds=3600, completion_timeout_seconds=1,
                           allow_post_copy=True)
        await do(pair.source, source, work("migrate", ref, order, vmi(ref, "128Mi")))
        seen = await reports_until(reports, migration_report(pair.source.node, "converged"))
        modes = [r.migration.mode for r in seen if r.migration
                 and r.migration.state == "progress"]
        assert modes[0] == "PreCopy" and modes[-1] == "PostCopy"
        assert seen[-1].migration is not None and seen[-1].migration.mode == "PostCopy"
    finally:
        await source.close()


async def test_without_post_copy_the_completion_timeout_fails_it(pair: Pair) -> None:
    reports = await reports_of(pair.source)
    source = await pair.agent(pair.source)
    try:
        ref = await launched(pair, source, "slow")
        order = pair.order(completion_timeout_seconds=1)
        await do(pair.source, source, work("migrate", ref, order, vmi(ref, "128Mi")))
        await next_report(reports, migration_report(pair.source.node, "failed",
                                                    reason="completion timeout"))
        assert source.agent.migrations.book.outgoing == {}
        assert guests(source) == {ref.uid: libvirt.VIR_DOMAIN_RUNNING}
    finally:
        await source.close()


def agent_process(pair: Pair, log: Path) -> subprocess.Popen[bytes]:
    """The source's agent as its own process, to be killed with SIGKILL."""
    cluster = pair.source
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "nodeagent", "run", "--node", cluster.node,
             "--nats-url", pair.nats_url, "--prefix", cluster.layout.prefix,
             "--sim-state", pair.state(cluster), "--migration-report-interval", "0.05",
             "--sim-migration-bandwidth", "64Mi"],
            stdout=out, stderr=subprocess.STDOUT, env=os.environ)


async def test_a_source_killed_mid_transfer_reports_it_failed_when_back(
        pair: Pair, tmp_path: Path) -> None:
    """kill -9 of the source's agent while it transfers: the guest runs on where it was
    (the host outlives its agent), and the next agent reports the migration failed and
    forgets it; its work item, redelivered or not, starts nothing again."""
    reports = await reports_of(pair.source)
    ref = await pair.source.placed("killed")
    await pair.source.consumers.ensure(pair.source.node)  # as the control plane does
    process = agent_process(pair, tmp_path / "agent.log")
    try:
        await next_report(reports, lambda r: r.kind == "node" and r.node == pair.source.node)
        await publish(pair.source, pair.source.launch(ref))
        await next_report(reports, lambda r: bool(r.domain and r.domain.uid == ref.uid
                                                  and r.domain.phase == "Running"))
        order = pair.order(progress_timeout_seconds=3600)
        await publish(pair.source, work("migrate", ref, order, vmi(ref, "64Mi")))
        await next_report(reports, migration_report(pair.source.node, "progress"))
    finally:
        process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(process.wait)

    source = await pair.agent(pair.source)
    try:
        await next_report(reports, migration_report(pair.source.node, "failed",
                                                    reason=SOURCE_RESTARTED_REASON,
                                                    migration_uid=order.uid))
        assert guests(source) == {ref.uid: libvirt.VIR_DOMAIN_RUNNING}
        assert source.agent.migrations.book.outgoing == {}
        assert source.agent.migrations.transfers == {}
        assert await source.agent.worklog.migrations() == source.agent.migrations.book
    finally:
        await source.close()


async def test_a_target_back_after_succeeded_starts_the_guest(pair: Pair) -> None:
    """The target prepared, then its agent stopped; meanwhile the cluster appended Succeeded
    and moved the VMI there (here: the VMI placed on the target and Running), and the finish
    was never applied. The next agent starts the guest; it never reports it missing."""
    reports = await reports_of(pair.source)
    ref = await pair.target.placed("arrived")
    running = DomainObservation(namespace=ref.namespace, name=ref.name, uid=ref.uid,
                                phase="Running")
    order = pair.order()
    first = await pair.agent(pair.target)
    try:
        await do(pair.target, first, work("migrate-prepare", ref, order, vmi(ref)))
        await next_report(reports, migration_report(pair.target.node, "target-ready"))
    finally:
        await first.close()
    await pair.target.run("VirtualMachineInstance", "observe", ref.name,
                          msgspec.to_builtins(running), actor=node_actor(pair.target.node))

    second = await pair.agent(pair.target)
    try:
        assert guests(second) == {ref.uid: libvirt.VIR_DOMAIN_RUNNING}
        assert second.agent.migrations.book.incoming == {}
        said = await reports_until(reports, lambda r: bool(
            r.domain and r.domain.uid == ref.uid and r.domain.phase == "Running"))
        said += await fence(pair.target, reports)
        assert [r for r in said if r.domain and r.domain.reason == DOMAIN_MISSING_REASON] == []
        await do(pair.target, second, work("migrate-finish", ref, order))  # comes late
        assert guests(second) == {ref.uid: libvirt.VIR_DOMAIN_RUNNING}
    finally:
        await second.close()


async def test_a_target_back_before_the_log_moved_the_vmi_keeps_the_guest(pair: Pair) -> None:
    """libvirt handed the guest to the target (its domain runs there) and the target's agent
    stopped before the source's converged report moved the VMI: the next agent finds a
    domain whose VMI the log still places on the source. It is the prepared migration's to
    settle, not a stray: removing it would leave the guest running nowhere."""
    reports = await reports_of(pair.source)
    ref = await pair.source.placed("handed-over")
    order = pair.order()
    first = await pair.agent(pair.target)
    try:
        await do(pair.target, first, work("migrate-prepare", ref, order, vmi(ref)))
        await next_report(reports, migration_report(pair.target.node, "target-ready"))
        await first.agent.guests.launch(vmi(ref), ref)  # as libvirt's hand-over defines it here
    finally:
        await first.close()
    second = await pair.agent(pair.target)
    try:
        assert guests(second) == {ref.uid: libvirt.VIR_DOMAIN_RUNNING}
        assert ref.uid in second.agent.migrations.book.incoming
    finally:
        await second.close()


async def test_a_failed_migration_leaves_the_target_empty(pair: Pair) -> None:
    """A prepared target holds the guest's devices, also after a restart; cleanup after
    Failed: the prepared migration and its devices go, and nothing ever ran there."""
    reports = await reports_of(pair.source)
    target = await pair.agent(pair.target)
    try:
        ref = VMIRef(pair.target.namespace, "gone-wrong", str(uuid.uuid4()))
        order = pair.order()
        await do(pair.target, target, work("migrate-prepare", ref, order, vmi(ref)))
        await next_report(reports, migration_report(pair.target.node, "target-ready"))
    finally:
        await target.close()
    target = await pair.agent(pair.target)
    try:
        assert ref.uid in target.agent.guests.ledger.holders(), "held again by the next agent"
        await do(pair.target, target, work("migrate-cleanup", ref, order))
        assert target.agent.migrations.book.incoming == {}
        assert ref.uid not in target.agent.guests.ledger.holders()
        assert guests(target) == {}
    finally:
        await target.close()


async def test_a_target_without_free_devices_is_not_ready(pair: Pair) -> None:
    reports = await reports_of(pair.source)
    target = await pair.agent(pair.target, tun_devices=0)
    try:
        ref = VMIRef(pair.target.namespace, "crowded", str(uuid.uuid4()))
        await do(pair.target, target, work("migrate-prepare", ref, pair.order(), vmi(ref)))
        failed = await next_report(reports, migration_report(pair.target.node, "failed"))
        assert failed.migration is not None
        assert failed.migration.reason.startswith(
            "target not ready: devices.kubevirt.io/tun: 0 of 0 free"), failed.migration.reason
        assert target.agent.migrations.book.incoming == {}
        assert target.agent.guests.ledger.holders() == frozenset()
    finally:
        await target.close()


async def test_migration_work_that_makes_no_sense_is_rejected(pair: Pair) -> None:
    """No order, an order that names other nodes or negative limits, no VMI, a guest that is
    not here: each rejected (counted, terminated); those that name this node as the side the
    cluster waits on are reported failed too, with the reason."""
    reports = await reports_of(pair.source)
    source = await pair.agent(pair.source)
    try:
        ref = VMIRef(pair.source.namespace, "nowhere", str(uuid.uuid4()))
        not_ours = [work("migrate", ref, None, vmi(ref)),
                    work("migrate", ref, msgspec.structs.replace(
                        pair.order(), source_node="other-node"), vmi(ref)),
                    work("migrate-abort", ref, msgspec.structs.replace(
                        pair.order(), source_node=pair.target.node, target_node="x"))]
        ours = {"migration .+: a negative bandwidth or timeout":
                work("migrate", ref, pair.order(bandwidth_bytes_per_second=-1), vmi(ref)),
                "a migrate command without its VMI": work("migrate", ref, pair.order(), None),
                f"VMI {ref.namespace}/nowhere does not run on this node":
                work("migrate", ref, pair.order(), vmi(ref))}
        for command in [*not_ours, *ours.values()]:
            await do(pair.source, source, command)
        assert source.agent.work.rejected == len(not_ours) + len(ours)
        failed = {r.migration.migration_uid: r for r in await fence(pair.source, reports)
                  if r.migration and r.migration.state == "failed"}
        assert set(failed) == {c.migration.uid for c in ours.values() if c.migration}
        for reason, command in ours.items():
            assert command.migration is not None
            report = failed[command.migration.uid]
            assert report.migration is not None
            assert re.fullmatch(reason, report.migration.reason), report.migration.reason
            assert report.correlation_id == "corr-migrate"
        assert source.agent.migrations.book.outgoing == {}
    finally:
        await source.close()


async def test_a_guest_that_crashes_mid_transfer_fails_its_migration(pair: Pair) -> None:
    reports = await reports_of(pair.source)
    source = await pair.agent(pair.source)
    try:
        ref = await launched(pair, source, "crashing")
        order = pair.order(progress_timeout_seconds=3600)
        await do(pair.source, source, work("migrate", ref, order, vmi(ref, "64Mi")))
        await next_report(reports, migration_report(pair.source.node, "progress"))
        await source.agent.simulate(SimRequest(action="guest-crash", namespace=ref.namespace,
                                               name=ref.name))
        await next_report(reports, migration_report(pair.source.node, "failed",
                                                    reason=SOURCE_LOST_DOMAIN_REASON))
        assert source.agent.migrations.book.outgoing == {}
    finally:
        await source.close()


async def test_a_source_back_after_succeeded_removes_its_copy_quietly(pair: Pair) -> None:
    """The transfer converged, then the source's agent stopped; the cluster appended
    Succeeded and moved the VMI to the target. The next source agent removes its copy as
    the cleanup would: no report of it, no mark of a finished VMI (it may come back here)."""
    reports = await reports_of(pair.source)
    ref = await pair.target.placed("departed")  # where the log has it once Succeeded
    first = await pair.agent(pair.source)
    try:
        await first.agent.work.execute(pair.source.launch(ref), ref)
        order = pair.order()
        await do(pair.source, first, work("migrate", ref, order, vmi(ref)))
        await next_report(reports, migration_report(pair.source.node, "converged"))
    finally:
        await first.close()

    second = await pair.agent(pair.source)
    try:
        assert guests(second) == {}
        assert second.agent.migrations.book.outgoing == {}
        assert not await second.agent.worklog.finished(ref.uid)
        said = [r.domain for r in await fence(pair.source, reports) if r.domain]
        assert [d for d in said if d.uid == ref.uid and d.gone] == []
    finally:
        await second.close()


@pytest.mark.parametrize(("address", "accepted"), [
    ("", True), ("127.0.0.3", True), ("node-2.example.org", True), ("fe80::1", True),
    ("a b", False), ("host/path", False), ("[::1]", False), ("user@host", False),
    ("-lead", False), ("h" * 254, False), ("host:16509", False)])
def test_a_migration_address_is_a_host_or_it_does_not_decode(address: str,
                                                             accepted: bool) -> None:
    """It becomes part of the URIs a source's libvirt connects to: anything but a host name
    or an IP address is refused where the message is decoded, in a report or an order."""
    fields = {"uid": "u", "name": "m", "source_node": "a", "target_node": "b",
              "target_address": address}
    wire = msgspec.msgpack.encode(fields)
    if accepted:
        assert msgspec.msgpack.decode(wire, type=MigrationOrder).target_address == address
        return
    with pytest.raises(msgspec.ValidationError, match="target_address"):
        msgspec.msgpack.decode(wire, type=MigrationOrder)
    report = {"namespace": "n", "name": "v", "vmi_uid": "u", "migration_uid": "m",
              "state": "target-ready", "target_address": address}
    with pytest.raises(msgspec.ValidationError, match="target_address"):
        msgspec.msgpack.decode(msgspec.msgpack.encode(report), type=MigrationObservation)


@pytest.mark.parametrize(("flag", "value", "error"), [
    ("--migration-address", "a b", "not a host name or an IP address: 'a b'"),
    ("--sim-migration-bandwidth", "0", "must be more than 0: '0'"),
    ("--sim-dirty-rate", "fast", "not a quantity: 'fast'"),
    ("--sim-dirty-rate", "-1Mi", "must not be negative: '-1Mi'"),
    ("--migration-report-interval", "0", "must be more than 0: '0'")])
def test_the_simulation_options_are_checked(flag: str, value: str, error: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        agent_main(["run", "--node", "n", "--nats-url", "nats://127.0.0.1:1", f"{flag}={value}"])
    assert exited.value.code == 2
    assert f"argument {flag}: {error}" in capsys.readouterr().err
