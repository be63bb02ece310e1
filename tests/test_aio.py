"""A service's parts end together: one that fails stops the others before its error reaches
the caller (who closes the connection next), so none is left to fail on the closed
connection and be reported with a traceback when the loop closes. What asyncio reports
itself is one log line."""

from __future__ import annotations

import asyncio
import gc

import pytest
from nats.errors import ConnectionClosedError
from structlog.testing import capture_logs

from events.aio import report_loop_errors, together


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
