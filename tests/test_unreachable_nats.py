"""An unreachable NATS, with real processes and real sockets (no NATS is mocked): a command
says so in one line and exits non-zero; a service retries, one log line per attempt, and
stops on a signal; a service whose server goes away says so in one line, retries, and says
when it is back. Never a traceback.

The dead port is a free port nobody listens on. Subprocess timeouts are safety nets against
a hang, not measurements."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, ServiceUnavailableError

from events.jetstream.connect import connect, describe, shown
from events.jetstream.server import EmbeddedNats, free_port
from events.jetstream.streams import ensure_all
from events.language.subjects import Layout

ROOT = Path(__file__).resolve().parent.parent
VIRTBUS = Path(sys.executable).parent / "virtbus"
SAFETY_NET_SECONDS = 60.0
"""How long a process may take before the test calls it hung; never an assertion on time."""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No context file or NATS URL of the person running the tests leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTBUS_")}
    return {**env, "VIRTBUS_CONTEXT": str(tmp_path / "context.json"), **extra}


def _virtbus(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VIRTBUS), *argv], check=False, capture_output=True, text=True,
                          env=_env(tmp_path, **env), cwd=tmp_path, timeout=SAFETY_NET_SECONDS)


def _one_error_line(result: subprocess.CompletedProcess[str], url: str) -> None:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: cannot reach NATS at {url}: connection refused"], result.stderr


@pytest.fixture
def dead_url() -> str:
    return f"nats://127.0.0.1:{free_port()}"


# -- a person's commands ------------------------------------------------------------------


def test_up_against_an_unreachable_nats_says_so_in_one_line(tmp_path: Path,
                                                            dead_url: str) -> None:
    result = _virtbus(["up", "--nats-url", dead_url, "--data-dir", str(tmp_path / "data"),
                       "--nodes", "1"], tmp_path)
    _one_error_line(result, dead_url)
    assert not (tmp_path / "context.json").exists()  # nothing points at what is not up


def test_up_takes_the_url_from_the_environment_too(tmp_path: Path, dead_url: str) -> None:
    result = _virtbus(["up", "--data-dir", str(tmp_path / "data"), "--nodes", "1"], tmp_path,
                      VIRTBUS_NATS_URL=dead_url)
    _one_error_line(result, dead_url)


@pytest.mark.parametrize("argv", [
    ["get", "vm"],
    ["apply", "-f", str(ROOT / "examples" / "vm-cirros.yaml")],
    ["history", "vm", "testvm"],
    ["watch", "vm"],
], ids=lambda argv: argv[0])
def test_a_command_against_an_unreachable_nats_says_so_in_one_line(
        tmp_path: Path, dead_url: str, argv: list[str]) -> None:
    _one_error_line(_virtbus(argv, tmp_path, VIRTBUS_NATS_URL=dead_url), dead_url)


def test_the_error_line_shows_no_password(tmp_path: Path, dead_url: str) -> None:
    secret_url = dead_url.replace("nats://", "nats://alice:s3cret@")
    result = _virtbus(["get", "vm", "--nats-url", secret_url], tmp_path)
    _one_error_line(result, dead_url)


def test_shown_and_described() -> None:
    assert shown("nats://u:p@a:1, nats://TOKEN@b:2,nats://c:3") \
        == "nats://a:1,nats://b:2,nats://c:3"
    assert describe(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)")) \
        == "connection refused"
    assert describe(TimeoutError()) == "timed out"
    assert describe(NatsError("nats: 'Authorization Violation'")) == "authorization violation"
    assert describe(ServiceUnavailableError()) == "JetStream unavailable"
    assert describe(KeyNotFoundError()) == "key not found"  # a KV error has no description


# -- services -----------------------------------------------------------------------------


class Lines:
    """A process's output, line by line, each waited for with a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def until(self, wanted: Callable[[dict[str, Any]], bool], what: str,
              timeout: float = SAFETY_NET_SECONDS) -> dict[str, Any]:
        """The next log record that is `wanted`; every line before it is kept in `seen`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {what} in time; output:\n" + "\n".join(self.seen)
                                     ) from None
            if line is None:
                raise AssertionError(f"exited before {what}; output:\n" + "\n".join(self.seen))
            self.seen.append(line)
            _no_traceback([line])  # at once: no waiting for a line that a crash never writes
            record = _record(line)
            if record is not None and wanted(record):
                return record

    def rest(self) -> list[str]:
        """Every line up to the end of the output (the process has exited)."""
        while (line := self._queue.get(timeout=SAFETY_NET_SECONDS)) is not None:
            self.seen.append(line)
        return self.seen


def _record(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


@contextlib.contextmanager
def _running(args: list[str], tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Lines]]:
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env=_env(tmp_path, VIRTBUS_LOG_FORMAT="json", PYTHONUNBUFFERED="1"))
    try:
        yield proc, Lines(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _attempt(url: str, n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda r: (r.get("event"), r.get("url"), r.get("attempt")) \
        == ("cannot reach NATS", url, n)


def _no_traceback(lines: list[str]) -> None:
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    assert not any("nats: encountered error" in line for line in lines), "\n".join(lines)


def test_an_agent_retries_an_unreachable_nats_one_line_per_attempt(tmp_path: Path,
                                                                   dead_url: str) -> None:
    args = ["-m", "nodeagent", "run", "--node", "n1", "--nats-url", dead_url]
    with _running(args, tmp_path) as (proc, lines):
        for n in (1, 2):
            record = lines.until(_attempt(dead_url, n), f"attempt {n}")
            assert (record["url"], record["error"], record["level"]) \
                == (dead_url, "connection refused", "warning")
        assert all(_record(line) is not None for line in lines.seen), lines.seen  # 1 line each
        _no_traceback(lines.seen)
        proc.send_signal(signal.SIGTERM)  # still connecting: it stops all the same
        assert proc.wait(timeout=SAFETY_NET_SECONDS) == 0
        _no_traceback(lines.rest())


def _undecodable_event(url: str, layout: Layout) -> None:
    """A message on the log without a topic: the read service logs it, with its sequence,
    as skipped; a line that shows how far it has read."""

    async def publish() -> None:
        nc = await connect(url, "test")
        await nc.jetstream().publish(f"{layout.events_root}.probe.default.probe", b"?")
        await nc.close()

    asyncio.run(publish())


def _skipped(seq: int) -> Callable[[dict[str, Any]], bool]:
    return lambda r: r.get("event", "").startswith("skipped an event") and r["sequence"] == seq


def test_a_service_that_loses_nats_says_so_retries_and_comes_back(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats").start()
    layout = Layout("lost")

    async def prepare() -> None:
        nc = await connect(server.url, "test")
        await ensure_all(nc.jetstream(), layout, 1)
        await nc.close()

    try:
        asyncio.run(prepare())
        args = ["-m", "projections", "run", "--nats-url", server.url, "--prefix", layout.prefix]
        with _running(args, tmp_path) as (proc, lines):
            lines.until(lambda r: r.get("event") == "read service started", "the start")
            # Its start-up is over once it follows the log live: event 1 may come by its
            # replay, event 2 (written after 1 was read) only by the live consumer.
            for seq in (1, 2):
                _undecodable_event(server.url, layout)
                lines.until(_skipped(seq), f"event {seq} read")
            server.stop()
            lost = lines.until(lambda r: r.get("event") == "lost the connection to NATS",
                               "the loss")
            assert (lost["url"], lost["reconnecting"]) == (server.url, True)
            for n in (1, 2):
                record = lines.until(_attempt(server.url, n), f"attempt {n}")
                assert record["error"] == "connection refused"
            server = EmbeddedNats(tmp_path / "nats", port=server.port).start()
            back = lines.until(lambda r: r.get("event") == "reconnected to NATS", "the return")
            assert back["url"] == server.url
            assert all(_record(line) is not None for line in lines.seen), lines.seen
            _no_traceback(lines.seen)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=SAFETY_NET_SECONDS) == 0
            _no_traceback(lines.rest())
    finally:
        server.stop()
