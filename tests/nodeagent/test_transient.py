"""The node agent rides out what NATS fails for a moment, on real NATS and the shared
`test:///default` host: a report, its work consumer and its heartbeat each meet a JetStream
that does not answer (here: its stream or bucket is not there, which is how a stream being
elected answers), log one line per attempt, and carry on once it answers; the agent never
ends for it. Its work consumer is the control plane's to make again
(`controlplane.controllers.dispatcher.WorkConsumers`, which the control loop runs): the
agent waits for it, one line per look."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec
import pytest
from nats.js.errors import KeyNotFoundError, NotFoundError
from structlog.testing import capture_logs

from events.jetstream.streams import ensure_all, work_consumer
from events.language.messages import NodeReport, SimRequest
from events.language.subjects import encode_token
from nodeagent import lifecycle
from nodeagent.phases import GuestPhase
from tests.nodeagent.helpers import Cluster, Running, next_report, start
from tests.system.harness import eventually


def retried(logs: Sequence[Mapping[str, Any]], what: str,
            running: Running) -> Callable[[], Awaitable[bool]]:
    """Whether `what` was retried (its log line); fails at once if the agent ended."""

    async def seen() -> bool:
        if running.task.done():
            running.task.result()
            raise AssertionError("the agent ended")
        return any(r["event"] == f"{what}: NATS unavailable; retrying" for r in logs)

    return seen


WAITING = "waiting for the node's work consumer (the control plane makes it)"
"""What the agent logs, once per look, while its work consumer is not there."""


def consumer_missed(logs: Sequence[Mapping[str, Any]],
                    running: Running) -> Callable[[], Awaitable[bool]]:
    """Whether the agent noticed its work consumer gone: a pull it retried, or the consumer
    it waits for (a pull that was in flight may fail either way)."""
    pulled = retried(logs, "taking node work", running)
    waiting = retried(logs, WAITING, running)

    async def seen() -> bool:
        return await pulled() or await waiting()

    return seen


def failed(name: str) -> Callable[[NodeReport], bool]:
    def match(report: NodeReport) -> bool:
        return report.domain is not None and report.domain.name == name \
            and report.domain.phase == GuestPhase.FAILED

    return match


@pytest.mark.usefixtures("watcher")
async def test_a_report_nats_cannot_take_is_retried_and_the_agent_goes_on(
        cluster: Cluster, nats_url: str) -> None:
    """A guest crashes while the reports stream does not answer: its report is retried
    in place, and made once the stream answers again."""
    ref = await cluster.placed("crashy")
    running = await start(cluster, nats_url)
    js = cluster.nc.jetstream()
    try:
        await running.agent.work.execute(cluster.launch(ref), ref)
        await js.delete_stream(cluster.layout.reports_stream)
        with capture_logs() as logs:
            await running.agent.simulate(SimRequest(action="guest-crash",
                                                    namespace=ref.namespace, name=ref.name))
            await eventually(retried(logs, "reporting", running), what="the report retried")
        await ensure_all(js, cluster.layout, 1)
        reports = await js.pull_subscribe(cluster.layout.reports_filter,
                                          stream=cluster.layout.reports_stream)
        await next_report(reports, failed(ref.name))
        assert not running.task.done()
    finally:
        await running.close()


async def test_work_consumer_lost_is_set_up_again_and_work_goes_on(
        cluster: Cluster, nats_url: str) -> None:
    """The node stream (and with it the agent's consumer) does not answer: each pull is one
    log line and a pause; once the stream is back, the control plane's check sets the
    consumer up again, and work published then is done."""
    ref = await cluster.placed("after")
    running = await start(cluster, nats_url)
    js = cluster.nc.jetstream()
    try:
        with capture_logs() as logs:
            await js.delete_stream(cluster.layout.node_stream)
            await eventually(consumer_missed(logs, running), what="the consumer missed")
        await ensure_all(js, cluster.layout, 1)
        await cluster.consumers.check([cluster.node])  # as the control loop does
        reports = await js.pull_subscribe(cluster.layout.reports_filter,
                                          stream=cluster.layout.reports_stream)
        command = cluster.launch(ref)
        await js.publish(cluster.layout.node_subject(cluster.node, command.verb),
                         msgspec.msgpack.encode(command),
                         headers={"Nats-Msg-Id": command.event_id})
        report = await next_report(reports, lambda r: r.domain is not None
                                   and r.domain.name == ref.name)
        assert report.domain is not None and report.domain.phase == GuestPhase.RUNNING
        assert not running.task.done()
    finally:
        lifecycle.graceful_stop(running.agent.host.conn, ref.domain, 0, running.agent.host.watcher)
        await running.close()


async def test_heartbeats_start_once_their_bucket_answers(cluster: Cluster,
                                                          nats_url: str) -> None:
    """An agent that cannot bind the heartbeats bucket at start (not there yet) keeps
    trying at every beat, and beats once it is there: it does not go silent for good."""
    js = cluster.nc.jetstream()
    await js.delete_key_value(cluster.layout.heartbeats_bucket)
    running = await start(cluster, nats_url)
    try:
        await ensure_all(js, cluster.layout, 1)
        kv = await js.key_value(cluster.layout.heartbeats_bucket)

        async def beating() -> bool:
            try:
                await kv.get(encode_token(cluster.node))
            except KeyNotFoundError:
                return False
            return True

        await eventually(beating, what="a heartbeat")
        assert not running.task.done()
    finally:
        await running.close()


async def test_a_deleted_work_consumer_is_set_up_again(cluster: Cluster,
                                                       nats_url: str) -> None:
    """Only the consumer goes (an operator's mistake, a lost R1 consumer): the next pull
    finds no one to answer it, and the agent waits for its consumer, one line per look, and
    makes none itself; the control plane's check finds it gone and sets it up again, and
    work published then is done."""
    ref = await cluster.placed("again")
    running = await start(cluster, nats_url)
    js = cluster.nc.jetstream()
    try:
        await eventually(lambda: js.consumer_info(cluster.layout.node_stream,
                                                  work_consumer(cluster.node)),
                         what="the agent's work consumer")
        with capture_logs() as logs:
            await js.delete_consumer(cluster.layout.node_stream,
                                     work_consumer(cluster.node))
            await eventually(retried(logs, WAITING, running), what="the agent waiting")
        with pytest.raises(NotFoundError):  # the agent made none of its own
            await js.consumer_info(cluster.layout.node_stream, work_consumer(cluster.node))
        waits = [r for r in logs if r["event"] == f"{WAITING}: NATS unavailable; retrying"]
        assert "consumer not found" in waits[0]["error"], waits[0]
        await cluster.consumers.check([cluster.node])  # as the control loop does
        reports = await js.pull_subscribe(cluster.layout.reports_filter,
                                          stream=cluster.layout.reports_stream)
        command = cluster.launch(ref)
        await js.publish(cluster.layout.node_subject(cluster.node, command.verb),
                         msgspec.msgpack.encode(command),
                         headers={"Nats-Msg-Id": command.event_id})
        report = await next_report(reports, lambda r: r.domain is not None
                                   and r.domain.name == ref.name)
        assert report.domain is not None and report.domain.phase == GuestPhase.RUNNING
    finally:
        lifecycle.graceful_stop(running.agent.host.conn, ref.domain, 0, running.agent.host.watcher)
        await running.close()
