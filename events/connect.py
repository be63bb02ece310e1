"""The one way virtbus processes connect to NATS, and the one way they say it failed.

nats-py's defaults print a traceback for every failed attempt (its default `error_cb`) and,
told to retry forever, never say whether a server is there at all. Here a connection that
retries (a service) logs one structlog line per failed attempt, with the URL, the attempt
and the reason; one that does not (a command) raises `Unreachable`, one sentence that
names the URL and the reason. A connection lost later is one line, and so is its return.
"""

from __future__ import annotations

import argparse
import errno as errnos
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import structlog
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import StaleConnectionError
from nats.js.errors import APIError, ServiceUnavailableError

from events.subjects import DEFAULT_PREFIX

log = structlog.get_logger(__name__)

DEFAULT_URL: Final = "nats://127.0.0.1:4222"
NATS_URL_ENV: Final = "VIRTBUS_NATS_URL"
PREFIX_ENV: Final = "VIRTBUS_PREFIX"

ONE_SHOT_ATTEMPTS: Final = 1
"""Retries per server of a connection that does not reconnect (nats-py makes that many
plus one attempts), before `connect` raises `Unreachable`."""
ONE_SHOT_WAIT_SECONDS: Final = 0.5
"""Between those attempts (nats-py's 2 s is a service's pace; a person is waiting here)."""

ErrorCallback = Callable[[Exception], Awaitable[None]]
Callback = Callable[[], Awaitable[None]]


class Unreachable(ConnectionError):
    """No NATS server of `url` took the connection; `reason` says why, in a few words."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.shown = shown(url)
        self.reason = reason
        super().__init__(f"cannot reach NATS at {self.shown}: {reason}")


def servers(url: str) -> list[str]:
    """`nats://a:4222,nats://b:4222` as a list: nats-py takes a comma list as one URL."""
    return [u.strip() for u in url.split(",") if u.strip()]


def shown(url: str) -> str:
    """The URL(s) as they may be printed: without a user, password or token."""
    out = []
    for server in servers(url) or [url]:
        parts = urlsplit(server)
        bare = parts._replace(netloc=parts.netloc.rpartition("@")[2])
        out.append(urlunsplit(bare) if "@" in parts.netloc else server)
    return ",".join(out)


def describe(error: BaseException) -> str:
    """A NATS failure in a few words: `connection refused`, `timed out`,
    `authorization violation`, `JetStream unavailable`."""
    if isinstance(error, ssl.SSLError):
        return f"TLS: {error.reason or error}"
    if isinstance(error, socket.gaierror):
        return f"unknown host ({(error.strerror or str(error)).lower()})"
    if isinstance(error, TimeoutError):  # asyncio's and nats-py's too
        return "timed out"
    if isinstance(error, ServiceUnavailableError):  # not always with a description
        return "JetStream unavailable"
    if isinstance(error, APIError):
        return error.description or type(error).__name__
    if isinstance(error, OSError) and error.errno is not None and error.errno in errnos.errorcode:
        return os.strerror(error.errno).lower()  # not asyncio's "Connect call failed (...)"
    text = str(error).removeprefix("nats: ").strip()
    if len(text) > 1 and text[0] == text[-1] == "'":  # a server's -ERR, 'Stale Connection'
        text = text[1:-1] if '"' in text else text[1:-1].lower()  # a subject keeps its case
    return text or type(error).__name__


def inbox_prefix(url: str) -> str:
    """`_INBOX.<user>` for a connection that logs in as a user, else nats-py's `_INBOX`.

    Replies (JetStream API answers, acks, direct gets, ordered consumer deliveries) arrive
    on the inbox, so each role in `deploy/nats/accounts.conf` may subscribe to its own
    inbox subtree only and cannot read another role's replies. A bare token
    (`nats://TOKEN@host`) is never put in a subject.
    """
    first = urlsplit(servers(url)[0]) if servers(url) else None
    if first is None or not first.username or first.password is None:
        return "_INBOX"
    return f"_INBOX.{first.username}"


class _Reporter:
    """nats-py's callbacks for one connection: counts failed attempts, keeps the last
    reason, and logs each as one line unless the caller took `error_cb` for itself."""

    def __init__(self, nc: Client, url: str, name: str, options: dict[str, Any]) -> None:
        self.nc = nc
        self.url = shown(url)
        self.name = name
        self.own_error_cb: ErrorCallback | None = options.get("error_cb")
        self.own_disconnected_cb: Callback | None = options.get("disconnected_cb")
        self.own_reconnected_cb: Callback | None = options.get("reconnected_cb")
        self.quiet = self.own_error_cb is not None
        self.gives_up = options["max_reconnect_attempts"] > 0
        """nats-py retries forever at connect unless this is positive; if it gives up, the
        last reason is raised as `Unreachable`, so the attempts are not logged as well."""
        self.connected = False
        self.attempt = 0
        self.last_error: Exception | None = None
        self.lost: Exception | None = None
        options.update(error_cb=self.on_error, disconnected_cb=self.on_disconnected,
                       reconnected_cb=self.on_reconnected)

    async def on_error(self, e: Exception) -> None:
        if self.nc.is_closed:  # closing a failed attempt's socket: that attempt was told
            pass
        elif not self.nc.is_connected and isinstance(e, OSError | NatsError):
            self.attempt += 1
            self.last_error = e
            if not self.quiet and (self.connected or not self.gives_up):
                log.warning("cannot reach NATS", url=self.url, connection=self.name,
                            attempt=self.attempt, error=describe(e))
        elif isinstance(e, StaleConnectionError):  # the server went away: on_disconnected
            self.lost = e
        elif self.quiet:
            pass
        elif isinstance(e, OSError | NatsError):
            log.warning("NATS error", url=self.url, connection=self.name, error=describe(e))
        else:  # a subscription's callback failed: a bug, worth its traceback
            log.error("NATS callback failed", connection=self.name, exc_info=e)
        if self.own_error_cb is not None:
            await self.own_error_cb(e)

    async def on_disconnected(self) -> None:
        if (self.nc.is_reconnecting or self.lost is not None) and not self.quiet:
            log.warning("lost the connection to NATS", url=self.url, connection=self.name,
                        error=describe(self.lost) if self.lost else "connection closed",
                        reconnecting=self.nc.is_reconnecting)
        self.lost = None
        if self.own_disconnected_cb is not None:
            await self.own_disconnected_cb()

    async def on_reconnected(self) -> None:
        if not self.quiet:
            log.info("reconnected to NATS", url=self.url, connection=self.name,
                     attempts=self.attempt + 1)
        self.attempt = 0
        if self.own_reconnected_cb is not None:
            await self.own_reconnected_cb()

    def on_connected(self) -> None:
        if self.attempt and not self.quiet:
            log.info("connected to NATS", url=self.url, connection=self.name,
                     attempts=self.attempt + 1)
        self.connected = True
        self.attempt = 0


async def connect(url: str, name: str, **options: Any) -> Client:
    """A connection that names itself to the server and takes its replies on its user's own
    inbox subtree.

    By default a long-lived service connection: it retries forever, at start and after a
    loss, logging one line per failed attempt. With `allow_reconnect=False` (a command's
    connection) it tries each server `ONE_SHOT_ATTEMPTS + 1` times, `ONE_SHOT_WAIT_SECONDS`
    apart, unless told otherwise, then raises `Unreachable`. Any of nats-py's options may
    be given; an `error_cb` of the caller's own takes over the reporting (then nothing is
    logged here).
    """
    if options.get("allow_reconnect", True):
        options.setdefault("max_reconnect_attempts", -1)
    else:
        options.setdefault("max_reconnect_attempts", ONE_SHOT_ATTEMPTS)
        options.setdefault("reconnect_time_wait", ONE_SHOT_WAIT_SECONDS)
    options.setdefault("inbox_prefix", inbox_prefix(url))
    nc = Client()
    reporter = _Reporter(nc, url, name, options)
    try:
        await nc.connect(servers(url), name=name, **options)
    except (OSError, NatsError) as e:  # NoServersError: every server failed its attempts
        raise Unreachable(url, describe(reporter.last_error or e)) from None
    reporter.on_connected()
    return nc


NATS_FAILURES: Final = (ConnectionError, TimeoutError, NatsError)
"""What a service's main may stop on when NATS fails it (`Unreachable` included)."""


def stopped_by(error: BaseException) -> int:
    """A service's last line when NATS failed it, and its exit status: one line, no
    traceback (its supervisor restarts it, and the restart retries NATS, one line per
    attempt)."""
    if isinstance(error, Unreachable):
        log.error("cannot reach NATS", url=error.shown, error=error.reason)
    else:
        log.error("stopped: NATS failed", error=describe(error),
                  error_type=type(error).__name__)
    return 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--nats-url` and `--prefix`, defaulting to `VIRTBUS_NATS_URL` / `VIRTBUS_PREFIX`."""
    parser.add_argument("--nats-url", default=os.environ.get(NATS_URL_ENV, DEFAULT_URL),
                        help="NATS server(s), comma-separated (env VIRTBUS_NATS_URL)")
    parser.add_argument("--prefix", default=os.environ.get(PREFIX_ENV, DEFAULT_PREFIX),
                        help="installation prefix of every subject and stream "
                             "(env VIRTBUS_PREFIX)")
