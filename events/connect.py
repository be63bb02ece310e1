"""The one way virtbus processes connect to NATS."""

from __future__ import annotations

import argparse
import os
from typing import Any, Final

import nats
from nats.aio.client import Client

from events.subjects import DEFAULT_PREFIX

DEFAULT_URL: Final = "nats://127.0.0.1:4222"


def servers(url: str) -> list[str]:
    """`nats://a:4222,nats://b:4222` as a list: nats-py takes a comma list as one URL."""
    return [u.strip() for u in url.split(",") if u.strip()]


async def connect(url: str, name: str, **options: Any) -> Client:
    """A long-lived service connection: reconnects forever, names itself to the server."""
    options.setdefault("max_reconnect_attempts", -1)
    return await nats.connect(servers(url), name=name, **options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--nats-url` and `--prefix`, defaulting to `VIRTBUS_NATS_URL` / `VIRTBUS_PREFIX`."""
    parser.add_argument("--nats-url", default=os.environ.get("VIRTBUS_NATS_URL", DEFAULT_URL),
                        help="NATS server(s), comma-separated (env VIRTBUS_NATS_URL)")
    parser.add_argument("--prefix", default=os.environ.get("VIRTBUS_PREFIX", DEFAULT_PREFIX),
                        help="installation prefix of every subject and stream "
                             "(env VIRTBUS_PREFIX)")
