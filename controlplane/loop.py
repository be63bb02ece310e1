"""The control loop: one pass over the log feeds the read model and the dispatcher, in that
order, so both see the same state at the same point (the dispatcher queues its node work
there and publishes it on its own task); the controllers follow a batch at a
time (every event folded since their last batch), their commands executed together, each
folded in as it is recorded, so appends are pipelined while the log is still read.

A batch is not waited for past `CONTROL_BATCH_WAIT_SECONDS`: one slow command (a conflict
decided again, a group commit behind others) does not hold every later decision. What is
still in flight is remembered per object, as KubeVirt's controller expectations do: an
event on an object with a controller command in flight waits, shown to no controller, until
the command is recorded and folded, so the object's own events never have a controller
decide on a state that lacks its pending change. A change elsewhere that has a controller
look at every object (the KubeVirt configuration, a preset) may still propose a command for
it; the writer decides that one after the pending one, on its memory: the same command
answers its first outcome, another is refused as no longer needed (KubeVirt's controllers
meet AlreadyExists there).

Start-up replays the log into the read model, from the newest snapshot no later than the
dispatcher's checkpoint (`projections.snapshots`), dispatching only past that checkpoint,
then reconciles every object once, then follows new events live.

What NATS cannot do now (a server of the cluster lost, a leader being elected) is retried
where it failed, one log line per attempt, until it works or the loop stops: a dispatch
(deduplicated by the event's id), the checkpoint, the heartbeat watch, the check of the
nodes' work consumers.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Final

import structlog
from nats.aio.client import Client

from controlplane.controllers import Controller
from controlplane.controllers.dispatcher import Dispatcher
from controlplane.controllers.scheduler import Scheduler
from controlplane.defaults import (
    CONTROL_BATCH_WAIT_SECONDS,
    CONTROL_BATCHES_IN_FLIGHT,
    CONTROLLER_RETRIES,
    NODE_MONITOR_GRACE_SECONDS,
    NODE_MONITOR_PERIOD_SECONDS,
    VM_BACKOFF_CHECK_PERIOD_SECONDS,
    WORK_CONSUMERS_CHECK_SECONDS,
)
from controlplane.drain.controller import EvacuationController
from controlplane.hco.controller import HCOController
from controlplane.migration.controller import MigrationController
from controlplane.node.controller import NodeLifecycle
from controlplane.replicaset.controller import ReplicaSetController
from controlplane.vm.controller import VMController
from controlplane.workloadupdate.controller import WorkloadUpdater
from controlplane.writer import Writer
from events.jetstream.transient import is_transient, note, retry_until_stopped
from events.language.codec import Event
from events.language.messages import Command
from events.language.subjects import Layout, split_aggregate_id
from events.runtime.aio import pause_unless_stopped, together, unless_stopped
from projections.cluster import ClusterState
from projections.follower import follow
from projections.kinds import FOLDS
from projections.snapshots import Snapshots, restore

log = structlog.get_logger(__name__)

FOLLOWED_KINDS: Final = tuple(FOLDS)
"""What the live follow asks the server for: the kinds the read model holds views of,
every kind but commands' markers. A marker is no object of the read model nor of any
controller, and it is half the log under client load: the writer knows its own markers as
it stores them (`Memory.stored_marker`). The replay up to the head reads them all, so the
memory knows every event still waiting for its marker when the intake starts."""

STALLED_AFTER_PERIODS: Final = 3
"""A node-monitor round that comes this many periods late (and at least half a grace
period late) finds a process that did not run meanwhile: stopped, starved, a leader resumed
after its lease moved. Heartbeats were not read meanwhile either, so no node is judged on
them: every node gets its grace again, as at start."""


class ControlLoop:
    def __init__(self, nc: Client, layout: Layout, writer: Writer,
                 node_grace_seconds: float = NODE_MONITOR_GRACE_SECONDS) -> None:
        self.nc = nc
        self.layout = layout
        self.writer = writer
        self.state = ClusterState()
        self.workload_updater = WorkloadUpdater()
        self.vms = VMController()
        self.controllers: list[Controller] = [self.vms, Scheduler(), HCOController(),
                                              MigrationController(), EvacuationController(),
                                              self.workload_updater, ReplicaSetController()]
        self.dispatcher = Dispatcher(nc, layout)
        self.lifecycle = NodeLifecycle(nc, layout, node_grace_seconds)
        self.live = asyncio.Event()
        self._unseen: list[Event] = []
        """Events folded that the controllers have not been shown yet."""
        self._woken = asyncio.Event()
        self._in_flight: dict[tuple[str, str], int] = {}
        """Objects (namespace, name) with controller commands not yet recorded: how many."""
        self._held: dict[tuple[str, str], list[Event]] = {}
        """Events on an object with a command in flight, shown to the controllers once
        none is."""
        self._batches: set[asyncio.Task[None]] = set()
        self._retrying: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        checkpoint = await retry_until_stopped(self.dispatcher.load_checkpoint,
                                               "loading the dispatcher's checkpoint", stop)
        if checkpoint is None:  # stopped first
            return
        # From a snapshot no later than the checkpoint, so the dispatcher sees every event it
        # has still to dispatch; the writer's memory starts as a copy of the same views.
        start = await restore(Snapshots(self.nc, self.layout), self.state, at_most=checkpoint)
        self.writer.handler.memory.views.update(
            {agg_id: view.copy() for agg_id, view in self.state.views.items()})
        log.info("control loop replaying", dispatcher_checkpoint=checkpoint, start=start)
        await together(
            follow(self.nc, self.layout, self._on_event, start=start,
                   on_caught_up=self._caught_up, stop=stop, live_kinds=FOLLOWED_KINDS),
            self._watch_heartbeats(stop),
            self._monitor_nodes(stop),
            self._wake_backoffs(stop),
            self._keep_work_consumers(stop),
            self._control(stop),
            self.dispatcher.run(stop),
        )

    async def _watch_heartbeats(self, stop: asyncio.Event) -> None:
        """The node lifecycle's heartbeat watch, set up again when NATS fails it."""
        attempt = 0
        while not stop.is_set():
            try:
                await self.lifecycle.watch(stop)
                return
            except Exception as e:
                if not is_transient(e):
                    raise
                attempt += 1
                await pause_unless_stopped(stop, note("watching heartbeats", e, attempt))

    async def _keep_work_consumers(self, stop: asyncio.Event) -> None:
        """Once live, every `WORK_CONSUMERS_CHECK_SECONDS`: each registered node's work
        consumer that is gone (deleted, lost with its stream or its server) is set up again,
        so its agent, which only binds to it, carries on."""
        if not await unless_stopped(self.live.wait(), stop):
            return
        attempt = 0
        while not stop.is_set():
            try:
                await self.dispatcher.consumers.check([n.name for n in self.state.nodes()])
                attempt, pause = 0, WORK_CONSUMERS_CHECK_SECONDS
            except Exception as e:
                if not is_transient(e):
                    raise
                attempt += 1
                pause = note("checking the nodes' work consumers", e, attempt)
            await pause_unless_stopped(stop, pause)

    async def _on_event(self, sequence: int, event: Event) -> None:
        self.state.apply(event, sequence)
        self.writer.handler.memory.observe(event, sequence)
        await retry_until_stopped(lambda: self.dispatcher.on_event(sequence, event, self.state),
                                  "dispatching", self._stop, event_sequence=sequence)
        if self.live.is_set():  # live, markers are not followed (`FOLLOWED_KINDS`)
            self._unseen.append(event)
            self._woken.set()

    async def _control(self, stop: asyncio.Event) -> None:
        """Show the controllers every event folded since their last batch, on the state as
        it is now (no await between two of them, so all decide on one state), and execute
        what they decide together. A command decided twice in a batch (the same id: the
        same decision on the same state) runs once, as last decided: the scheduler's
        ledger counts its last placement. An event on an object with a command in flight
        is held back until it is recorded."""
        if not await unless_stopped(self.live.wait(), stop):
            return
        while await unless_stopped(self._woken.wait(), stop):
            self._woken.clear()
            events, self._unseen = self._unseen, []
            decided: dict[str, Command] = {}
            for event in events:
                _, namespace, name = split_aggregate_id(event.originator_id)
                if (namespace, name) in self._in_flight:
                    self._held.setdefault((namespace, name), []).append(event)
                    continue
                for controller in self.controllers:
                    for command in controller.on_event(self.state, event):
                        decided[command.id] = command
            if decided:
                batch = asyncio.ensure_future(self.execute(list(decided.values())))
                self._batches.add(batch)
                batch.add_done_callback(self._batches.discard)
                await asyncio.wait([batch], timeout=CONTROL_BATCH_WAIT_SECONDS)
            while len(self._batches) >= CONTROL_BATCHES_IN_FLIGHT:
                await asyncio.wait(self._batches, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*self._batches, return_exceptions=True)

    async def _caught_up(self) -> None:
        self.writer.handler.memory.complete = True
        await retry_until_stopped(self.dispatcher.flush, "saving the dispatcher's checkpoint",
                                  self._stop)
        log.info("control loop live", sequence=self.state.last_sequence,
                 objects=len(self.state.views))
        self.live.set()
        for controller in self.controllers:
            await self.execute(controller.resync(self.state))

    async def _monitor_nodes(self, stop: asyncio.Event) -> None:
        await self.live.wait()
        stalled = max(STALLED_AFTER_PERIODS * NODE_MONITOR_PERIOD_SECONDS,
                      self.lifecycle.grace / 2)
        last = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            if now - last > stalled:
                log.warning("node monitor did not run for a while; every node gets its "
                            "grace again", seconds=round(now - last, 1))
                self.lifecycle.grant_grace(now)
            else:
                judged_at = await self.lifecycle.judgement_time(self.state)
                if judged_at is not None:
                    # Transitions first, folded in, so the fails see this round's NotReady.
                    await self.execute(self.lifecycle.transitions(self.state, judged_at))
                    await self.execute(self.lifecycle.failures(self.state, judged_at))
                # Eviction batches are due by the clock, not by an event.
                await self.execute(self.workload_updater.tick(self.state, datetime.now(UTC)))
            last = time.monotonic()
            await pause_unless_stopped(stop, NODE_MONITOR_PERIOD_SECONDS)

    async def _wake_backoffs(self, stop: asyncio.Event) -> None:
        """Start the VMs whose crash-loop backoff ran out: no event marks that moment, so the
        VM controller is asked on a clock (what is due is read from the state each time)."""
        await self.live.wait()
        while not stop.is_set():
            await self.execute(self.vms.due(self.state))
            await pause_unless_stopped(stop, VM_BACKOFF_CHECK_PERIOD_SECONDS)

    async def execute(self, commands: list[Command]) -> None:
        """Run controller commands, all at once (the writer orders those on one object)."""
        await asyncio.gather(*[self._execute_one(c) for c in commands])

    async def _execute_one(self, command: Command) -> None:
        """Run one controller command and fold its events in at once, so the next decision
        sees them (the same events arrive again from the log and are skipped); then show
        the controllers what was held back for its object. An event that lands on an
        object changed meanwhile by someone else (a client's command, another replica)
        waits for the log, which brings the other change first."""
        key = (command.namespace, command.name)
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        try:
            result = await self.writer.execute(command)
        except Exception as e:
            self._retry_later(command, e)
        else:
            for sequence, event in sorted(result.events, key=lambda pair: pair[0]):
                if self.state.is_next(event):
                    self.state.apply(event, sequence)
        finally:
            left = self._in_flight.pop(key) - 1
            if left:
                self._in_flight[key] = left
            elif (held := self._held.pop(key, None)) is not None:
                self._unseen[:0] = held  # before anything newer on it
                self._woken.set()

    def _retry_later(self, command: Command, error: BaseException) -> None:
        """A controller command the log could not take now (a lost connection, a server
        failing over) is sent again, same id, until it has its outcome; the loop goes on."""
        log.warning("controller command failed; retrying", command_id=command.id,
                    kind=command.kind, verb=command.verb, name=command.name,
                    error=repr(error))

        async def again() -> None:
            for attempt in range(CONTROLLER_RETRIES):
                await asyncio.sleep(min(2 ** attempt * 0.1, 5.0))  # backoff between tries
                try:
                    await self.writer.execute(command)
                    return
                except Exception as e:
                    log.warning("controller command failed again", command_id=command.id,
                                attempt=attempt + 2, error=repr(e))
            log.error("controller command abandoned; decided again at the object's next change "
                      "or the next start",
                      command_id=command.id)

        task = asyncio.ensure_future(again())
        self._retrying.add(task)
        task.add_done_callback(self._retrying.discard)
