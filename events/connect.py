"""The one way virtbus processes connect to NATS."""

from __future__ import annotations

import argparse
import os
from typing import Any, Final
from urllib.parse import urlsplit

import nats
from nats.aio.client import Client

from events.subjects import DEFAULT_PREFIX

DEFAULT_URL: Final = "nats://127.0.0.1:4222"
NATS_URL_ENV: Final = "VIRTBUS_NATS_URL"
PREFIX_ENV: Final = "VIRTBUS_PREFIX"


def servers(url: str) -> list[str]:
    """`nats://a:4222,nats://b:4222` as a list: nats-py takes a comma list as one URL."""
    return [u.strip() for u in url.split(",") if u.strip()]


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


async def connect(url: str, name: str, **options: Any) -> Client:
    """A long-lived service connection: reconnects forever, names itself to the server,
    takes its replies on its user's own inbox subtree."""
    options.setdefault("max_reconnect_attempts", -1)
    options.setdefault("inbox_prefix", inbox_prefix(url))
    return await nats.connect(servers(url), name=name, **options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--nats-url` and `--prefix`, defaulting to `VIRTBUS_NATS_URL` / `VIRTBUS_PREFIX`."""
    parser.add_argument("--nats-url", default=os.environ.get(NATS_URL_ENV, DEFAULT_URL),
                        help="NATS server(s), comma-separated (env VIRTBUS_NATS_URL)")
    parser.add_argument("--prefix", default=os.environ.get(PREFIX_ENV, DEFAULT_PREFIX),
                        help="installation prefix of every subject and stream "
                             "(env VIRTBUS_PREFIX)")
