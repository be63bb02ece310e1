"""The one way virtbus processes connect to NATS, and the one way they say it failed.

nats-py's defaults print a traceback for every failed attempt (its default `error_cb`) and,
told to retry forever, never say whether a server is there at all. Here a connection that
retries (a service) logs one structlog line per failed attempt, with the URL, the attempt
and the reason; one that does not (a command) raises `Unreachable`, one sentence that
names the URL and the reason. A connection lost later is one line, and so is its return.

How a process authenticates is an `Access`: the URL (which may still carry a user and
password, as before), or better a credentials file (mode 0600) and TLS files, given by path
so that no secret is ever in a URL, on a command line or in a log line. With a CA (or a
client certificate) the connection is TLS, and a server that does not offer TLS is refused
before any password is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import errno as errnos
import os
import socket
import ssl
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import msgspec
import structlog
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import SlowConsumerError, StaleConnectionError
from nats.js.errors import APIError, KeyValueError, ServiceUnavailableError

from events.language.subjects import DEFAULT_PREFIX
from events.runtime.aio import unless_stopped

log = structlog.get_logger(__name__)

DEFAULT_URL: Final = "nats://127.0.0.1:4222"
NATS_URL_ENV: Final = "VIRTBUS_NATS_URL"
PREFIX_ENV: Final = "VIRTBUS_PREFIX"
CREDENTIALS_ENV: Final = "VIRTBUS_NATS_CREDENTIALS"
CA_ENV: Final = "VIRTBUS_NATS_CA"
CERT_ENV: Final = "VIRTBUS_NATS_CERT"
KEY_ENV: Final = "VIRTBUS_NATS_KEY"
PRIVATE_MODE_BITS: Final = stat.S_IRWXG | stat.S_IRWXO
"""A credentials file or private key with any of these bits set is refused: readable (or
writable) by someone other than its owner."""
TLS_MINIMUM: Final = ssl.TLSVersion.TLSv1_2
_NOT_IN_A_SUBJECT: Final = frozenset(" \t\r\n.*>")

ONE_SHOT_ATTEMPTS: Final = 1
"""Retries per server of a connection that does not reconnect (nats-py makes that many
plus one attempts), before `connect` raises `Unreachable`."""
ONE_SHOT_WAIT_SECONDS: Final = 0.5
"""Between those attempts (nats-py's 2 s is a service's pace; a person is waiting here)."""

PING_INTERVAL_SECONDS: Final = 10
"""How often a connection asks its server whether it is still there (nats-py's default, 120
s, let a frozen or half-dead server go unnoticed for minutes: nothing fails over meanwhile)."""
MAX_OUTSTANDING_PINGS: Final = 2
"""Pings left unanswered before the connection is declared stale and re-established: a
server that stopped answering is noticed within (this + 1) x `PING_INTERVAL_SECONDS`."""

ErrorCallback = Callable[[Exception], Awaitable[None]]
Callback = Callable[[], Awaitable[None]]


class Unreachable(ConnectionError):
    """No NATS server of `url` took the connection; `reason` says why, in a few words."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.shown = shown(url)
        self.reason = reason
        super().__init__(f"cannot reach NATS at {self.shown}: {reason}")


class AccessRefused(Unreachable):
    """The credentials or TLS files cannot be used (unsafe mode, malformed, missing): said
    in one line, before anything is sent anywhere."""


class Credentials(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A credentials file's content: `{"user": "...", "password": "..."}`."""

    user: str
    password: str

    def __repr__(self) -> str:  # a stray log of it shows no password
        return f"Credentials(user={self.user!r}, password=<hidden>)"


def read_private(path: str, url: str, what: str) -> bytes:
    """A file only its owner may read: its bytes, or `AccessRefused` saying why not."""
    try:
        mode = os.stat(path).st_mode
        if mode & PRIVATE_MODE_BITS:
            raise AccessRefused(url, f"{what} {path} is readable by others "
                                     f"(mode {stat.S_IMODE(mode):04o}): chmod 600 {path}")
        return Path(path).read_bytes()
    except OSError as e:
        raise AccessRefused(url, f"{what} {path}: {describe(e)}") from None


def read_credentials(path: str, url: str = "") -> Credentials:
    """The user and password of a credentials file (mode 0600, JSON)."""
    try:
        creds = msgspec.json.decode(read_private(path, url, "credentials file"),
                                    type=Credentials)
    except msgspec.DecodeError as e:  # its message names a field, never a value
        raise AccessRefused(url, f"credentials file {path} is not "
                                 f'{{"user": "...", "password": "..."}}: {e}') from None
    if not creds.user or _NOT_IN_A_SUBJECT & set(creds.user):
        raise AccessRefused(url, f"credentials file {path}: the user must be a name without "
                                 "spaces, dots, '*' or '>'")
    return creds


class Access(msgspec.Struct, frozen=True):
    """How a process reaches NATS and proves who it is; every secret is in a file named
    here, none in the struct. `credentials` is a JSON `{"user", "password"}` file (0600);
    `ca` the CA bundle that verifies the server (TLS); `cert`/`key` a client certificate
    (mutual TLS; `key` may be left out if `cert` holds it)."""

    url: str
    credentials: str = ""
    ca: str = ""
    cert: str = ""
    key: str = ""

    @property
    def user(self) -> str:
        """Who this connection logs in as: the credentials file's user, else the URL's
        (empty for an anonymous connection or a bare token)."""
        if self.credentials:
            return read_credentials(self.credentials, self.url).user
        return url_user(self.url)

    @property
    def tls(self) -> bool:
        return bool(self.ca or self.cert)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client side of TLS, verifying the server against `ca` (the system's CAs if
        only a client certificate is given); None without TLS."""
        if not self.tls:
            return None
        if self.key and not self.cert:
            raise AccessRefused(self.url, f"client key {self.key} given without a certificate")
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                                 cafile=self.ca or None)
        except (OSError, ssl.SSLError) as e:
            raise AccessRefused(self.url, f"CA file {self.ca}: {describe(e)}") from None
        context.minimum_version = TLS_MINIMUM
        if self.cert:
            if self.key:
                read_private(self.key, self.url, "client key")
            try:
                context.load_cert_chain(self.cert, self.key or None)
            except (OSError, ssl.SSLError) as e:
                raise AccessRefused(self.url, f"client certificate {self.cert}: "
                                              f"{describe(e)}") from None
        return context


def servers(url: str) -> list[str]:
    """`nats://a:4222,nats://b:4222` as a list: nats-py takes a comma list as one URL."""
    return [u.strip() for u in url.split(",") if u.strip()]


def shown(target: str | Access) -> str:
    """The URL(s) as they may be printed: without a user, password or token."""
    url = target.url if isinstance(target, Access) else target
    out = []
    for server in servers(url) or [url]:
        parts = urlsplit(server)
        bare = parts._replace(netloc=parts.netloc.rpartition("@")[2])
        out.append(urlunsplit(bare) if "@" in parts.netloc else server)
    return ",".join(out)


def describe(error: BaseException) -> str:
    """A NATS failure in a few words: `connection refused`, `timed out`,
    `authorization violation`, `JetStream unavailable`."""
    if isinstance(error, ssl.SSLCertVerificationError):  # which certificate, and why
        return f"TLS: certificate verify failed: {error.verify_message}"
    if isinstance(error, ssl.SSLError):  # CERTIFICATE_REQUIRED: "certificate required"
        return f"TLS: {(error.reason or str(error)).lower().replace('_', ' ')}"
    if isinstance(error, socket.gaierror):
        return f"unknown host ({(error.strerror or str(error)).lower()})"
    if isinstance(error, TimeoutError):  # asyncio's and nats-py's too
        return "timed out"
    if isinstance(error, ServiceUnavailableError):  # not always with a description
        return "JetStream unavailable"
    if isinstance(error, KeyValueError):  # "key not found" has no description; its text says it
        return getattr(error, "description", None) or str(error).removeprefix("nats: ")
    if isinstance(error, APIError):
        return error.description or type(error).__name__
    if isinstance(error, OSError) and error.errno is not None and error.errno in errnos.errorcode:
        return os.strerror(error.errno).lower()  # not asyncio's "Connect call failed (...)"
    text = str(error).removeprefix("nats: ").strip()
    if len(text) > 1 and text[0] == text[-1] == "'":  # a server's -ERR, 'Stale Connection'
        text = text[1:-1] if '"' in text else text[1:-1].lower()  # a subject keeps its case
    return text or type(error).__name__


def url_user(url: str) -> str:
    """The user of the URL's first server, if it logs in with a user and password."""
    first = urlsplit(servers(url)[0]) if servers(url) else None
    if first is None or not first.username or first.password is None:
        return ""
    return first.username


def inbox_prefix(url: str) -> str:
    """`_INBOX.<user>` for a connection that logs in as a user, else nats-py's `_INBOX`.

    Replies (JetStream API answers, acks, direct gets, ordered consumer deliveries) arrive
    on the inbox, so each role in `deploy/nats/accounts.conf` may subscribe to its own
    inbox subtree only and cannot read another role's replies. A bare token
    (`nats://TOKEN@host`) is never put in a subject.
    """
    return inbox_for(url_user(url))


def inbox_for(user: str) -> str:
    """The inbox prefix of a connection that logs in as `user` (`""`: anonymous)."""
    return f"_INBOX.{user}" if user else "_INBOX"


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
        self.dropped = 0
        """Messages nats-py dropped for a slow consumer on this connection so far."""
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
        elif isinstance(e, SlowConsumerError):
            self._slow_consumer(e)
        elif isinstance(e, OSError | NatsError):
            log.warning("NATS error", url=self.url, connection=self.name, error=describe(e))
        else:  # a subscription's callback failed: a bug, worth its traceback
            log.error("NATS callback failed", connection=self.name, exc_info=e)
        if self.own_error_cb is not None:
            await self.own_error_cb(e)

    def _slow_consumer(self, e: SlowConsumerError) -> None:
        """A line at the 1st, 10th, 100th... message dropped: drops come in bursts, on a
        loop too busy already for a line each."""
        self.dropped += 1
        if self.dropped == 10 ** (len(str(self.dropped)) - 1):
            log.warning("NATS dropped messages: a subscription fell behind",
                        url=self.url, connection=self.name, subject=e.subject,
                        dropped_total=self.dropped)

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


async def connect(target: str | Access, name: str, **options: Any) -> Client:
    """A connection that names itself to the server and takes its replies on its user's own
    inbox subtree; `target` is a URL or an `Access` (credentials file, TLS).

    By default a long-lived service connection: it retries forever, at start and after a
    loss, logging one line per failed attempt. With `allow_reconnect=False` (a command's
    connection) it tries each server `ONE_SHOT_ATTEMPTS + 1` times, `ONE_SHOT_WAIT_SECONDS`
    apart, unless told otherwise, then raises `Unreachable`. Any of nats-py's options may
    be given; an `error_cb` of the caller's own takes over the reporting (then nothing is
    logged here). A server that stops answering is noticed by pings
    (`PING_INTERVAL_SECONDS`, `MAX_OUTSTANDING_PINGS`, unless given). Unusable credentials
    or TLS files raise `AccessRefused` at once.
    """
    access = target if isinstance(target, Access) else Access(target)
    url = access.url
    options.setdefault("ping_interval", PING_INTERVAL_SECONDS)
    options.setdefault("max_outstanding_pings", MAX_OUTSTANDING_PINGS)
    if options.get("allow_reconnect", True):
        options.setdefault("max_reconnect_attempts", -1)
    else:
        options.setdefault("max_reconnect_attempts", ONE_SHOT_ATTEMPTS)
        options.setdefault("reconnect_time_wait", ONE_SHOT_WAIT_SECONDS)
    nc = Client()
    context = access.ssl_context()
    if context is not None:
        options.setdefault("tls", context)
    user = url_user(url)
    if access.credentials:
        if any("@" in urlsplit(server).netloc for server in servers(url)):
            raise AccessRefused(url, "a user in the URL and a credentials file: "
                                     "give it in the file only")
        creds = read_credentials(access.credentials, url)
        user = creds.user
        options.setdefault("user", creds.user)
        options.setdefault("password", _password_over_tls(nc, creds.password, access.tls))
    options.setdefault("inbox_prefix", inbox_for(user))
    reporter = _Reporter(nc, url, name, options)
    try:
        await nc.connect(servers(url), name=name, **options)
    except (OSError, NatsError) as e:  # NoServersError: every server failed its attempts
        error = reporter.last_error or e
        hint = NO_CLIENT_CERT if access.tls and not access.cert and _dropped(error) else ""
        raise Unreachable(url, describe(error) + hint) from None
    if access.tls and not _offers_tls(nc):
        await nc.close()
        raise Unreachable(url, NO_TLS)
    reporter.on_connected()
    return nc


async def connect_unless_stopped(target: str | Access, name: str, stop: asyncio.Event,
                                 **options: Any) -> Client | None:
    """A service's `connect`, given up when `stop` is set first (None), with one line: its
    connection retries for ever while NATS does not answer, and a signal must still stop
    the service at once."""
    connecting = asyncio.ensure_future(connect(target, name, **options))
    if await unless_stopped(connecting, stop):
        return connecting.result()
    log.info("stopped before NATS answered", url=shown(target), connection=name)
    return None


NO_TLS: Final = "the server does not offer TLS (refused: TLS was asked for)"
NO_CLIENT_CERT: Final = " (after the TLS handshake: does the server want a client certificate?)"
"""With TLS 1.3 a server that wants a client certificate says so only by closing."""


def _dropped(error: BaseException) -> bool:
    return isinstance(error, ConnectionError) and not isinstance(error, ConnectionRefusedError)


def _offers_tls(nc: Client) -> bool:
    """Whether the server this connection is talking to required TLS, so that nats-py
    upgraded the connection before sending CONNECT (it does so only when told)."""
    info: dict[str, Any] = nc._server_info  # nats-py has no public INFO
    return bool(info.get("tls_required"))


def _password_over_tls(nc: Client, password: str, tls: bool) -> Callable[[], str]:
    """nats-py asks for the password as it sends CONNECT, on every (re)connection: with TLS
    asked for, never to a server that spoke in clear (misconfigured, or a man in the
    middle that stripped `tls_required`)."""

    def now() -> str:
        if tls and not _offers_tls(nc):
            raise NatsError(f"nats: {NO_TLS}")
        return password

    return now


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
    """`--nats-url`, `--prefix` and the access files, each defaulting to its environment
    variable (`VIRTBUS_NATS_URL`, `VIRTBUS_PREFIX`, `VIRTBUS_NATS_CREDENTIALS`, ...)."""
    parser.add_argument("--nats-url", default=os.environ.get(NATS_URL_ENV, DEFAULT_URL),
                        help="NATS server(s), comma-separated (env VIRTBUS_NATS_URL); "
                             "no password here: use --nats-credentials")
    parser.add_argument("--prefix", default=os.environ.get(PREFIX_ENV, DEFAULT_PREFIX),
                        help="installation prefix of every subject and stream "
                             "(env VIRTBUS_PREFIX)")
    for flag, env, what in ACCESS_FLAGS:
        parser.add_argument(flag, default=os.environ.get(env, ""), metavar="FILE",
                            help=f"{what} (env {env})")


ACCESS_FLAGS: Final = (
    ("--nats-credentials", CREDENTIALS_ENV,
     'JSON {"user": ..., "password": ...}, mode 0600'),
    ("--nats-ca", CA_ENV, "CA certificate(s) that verify the server: TLS"),
    ("--nats-cert", CERT_ENV, "client certificate: mutual TLS"),
    ("--nats-key", KEY_ENV, "the client certificate's private key, mode 0600"),
)


def access_from_args(args: argparse.Namespace) -> Access:
    """The `Access` that `add_arguments`' flags (or their environment variables) name."""
    return Access(args.nats_url, credentials=args.nats_credentials, ca=args.nats_ca,
                  cert=args.nats_cert, key=args.nats_key)
