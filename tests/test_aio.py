"""A service's parts end together: one that fails stops the others before its error reaches
the caller (who closes the connection next), so none is left to fail on the closed
connection and be reported with a traceback when the loop closes. What asyncio reports
itself is one log line."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError
from structlog.testing import capture_logs

from events.runtime.aio import claimed, delivered_sequence, report_loop_errors, together


async def test_the_first_part_to_fail_ends_the_others_before_its_error_is_raised() -> None:
    started, ended = asyncio.Event(), asyncio.Event()

    async def serving() -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            ended.set()
            raise ConnectionClosedError  # its way out meets the closing connection

    async def failing() -> None:
        await started.wait()
        raise TimeoutError("the stream did not answer")

    with pytest.raises(TimeoutError, match="did not answer"):
        await together(serving(), failing())
    assert ended.is_set()  # cancelled and finished, not left running


async def test_an_error_no_task_retrieved_is_one_log_line() -> None:
    report_loop_errors(asyncio.get_running_loop())

    async def failing() -> None:
        raise ConnectionClosedError

    task = asyncio.ensure_future(failing())
    await asyncio.wait([task])  # done; its exception never asked for
    with capture_logs() as logs:
        del task
        gc.collect()
    [line] = logs
    assert line["log_level"] == "error" and "never retrieved" in line["event"]
    assert line["error"] == "ConnectionClosedError()" and line["coroutine"].endswith("failing")
    assert "exc_info" not in line


def test_a_loop_whose_claims_are_settled_is_not_kept_alive() -> None:
    """The claims of a loop share one timer, which holds the loop; once none is held the
    timer goes, so a loop that ran work items (each test, each `asyncio.run`) is freed."""
    ran_on: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def work() -> None:
        ran_on.append(weakref.ref(asyncio.get_running_loop()))
        async with claimed(Msg(_client=None, subject="work")):  # type: ignore[arg-type]
            await asyncio.sleep(0)

    asyncio.run(work())
    gc.collect()
    assert ran_on[0]() is None


@pytest.mark.parametrize("reply", [
    "$JS.ACK.EVENTS.follow.1.4242.17.1700000000000000000.3",
    "$JS.ACK.hub.ACCHASH.EVENTS.follow.2.4242.17.1700000000000000000.3.r4nd",
    "$JS.ACK.hub.ACCHASH.EVENTS.follow.2.4242.17.1700000000000000000.3",
])
def test_a_delivery_s_stream_sequence_is_read_as_nats_py_reads_it(reply: str) -> None:
    msg = Msg(_client=None, subject="ev.x", reply=reply)  # type: ignore[arg-type]
    assert delivered_sequence(msg) == msg.metadata.sequence.stream == 4242
