"""A real nats-server on the shipped `deploy/nats/accounts.conf`, and connections to it as
each role: shared by the tests that try the permissions as an attacker would."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from events.connect import connect
from events.server import EmbeddedNats

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ACCOUNTS_CONF = DEPLOY / "nats" / "accounts.conf"
# `$NAME` outside quotes: an environment variable the server must be given.
_ENV_REF = re.compile(r'^[^"#\n]*?\$([A-Za-z_][A-Za-z0-9_]*)', re.MULTILINE)
PASSWORD = "test-password"

Refusals = list[str]


def env_for(*texts: str) -> dict[str, str]:
    """The environment a server on these config texts needs: each variable they name, set
    to `PASSWORD`."""
    names = {name for text in texts for name in _ENV_REF.findall(text)}
    return {**os.environ, **dict.fromkeys(names, PASSWORD)}


async def connect_as(url: str, user: str) -> tuple[Client, Refusals]:
    """A one-shot connection as `user` (password `PASSWORD`), and the server's asynchronous
    refusals (permission violations) as they arrive."""
    refusals: Refusals = []

    async def on_error(e: Exception) -> None:
        refusals.append(str(e))

    nc = await connect(url.replace("nats://", f"nats://{user}:{PASSWORD}@"), user,
                       error_cb=on_error, allow_reconnect=False)
    return nc, refusals


def serve_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 accounts_text: str) -> Iterator[str]:
    """A server on `accounts_text` (included from a server config); its passwords are in
    the environment it inherits."""
    (tmp_path / "accounts.conf").write_text(accounts_text)
    (tmp_path / "server.conf").write_text("include ./accounts.conf\n")
    for name, value in env_for(accounts_text).items():
        monkeypatch.setenv(name, value)
    with EmbeddedNats(tmp_path / "data", config=tmp_path / "server.conf") as server:
        yield server.url


@pytest.fixture
def secured_nats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A server on the shipped accounts.conf."""
    yield from serve_config(tmp_path, monkeypatch, ACCOUNTS_CONF.read_text())
