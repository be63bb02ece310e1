"""Where a CLI command finds virtbus, and how it logs in: flag, then environment
(`VIRTBUS_NATS_URL`, `VIRTBUS_NATS_CREDENTIALS`, `VIRTBUS_NATS_CA`, ...), then the context
file that `virtbus up` wrote, then the default local server. The context holds paths of
credentials and TLS files, never a secret."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from events.jetstream.connect import (
    CA_ENV,
    CERT_ENV,
    CREDENTIALS_ENV,
    DEFAULT_URL,
    KEY_ENV,
    NATS_URL_ENV,
    PREFIX_ENV,
    Access,
)
from events.language.subjects import DEFAULT_PREFIX


class Context(msgspec.Struct, frozen=True, kw_only=True):
    nats_url: str = DEFAULT_URL
    prefix: str = DEFAULT_PREFIX
    data_dir: str = ""
    credentials: str = ""
    """Paths, as in `events.jetstream.connect.Access`."""
    ca: str = ""
    cert: str = ""
    key: str = ""

    @property
    def access(self) -> Access:
        return Access(self.nats_url, credentials=self.credentials, ca=self.ca,
                      cert=self.cert, key=self.key)


def context_path() -> Path:
    explicit = os.environ.get("VIRTBUS_CONTEXT")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "virtbus" / "context.json"


def write_context(ctx: Context) -> Path:
    path = context_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(ctx)))
    return path


def resolve(nats_url: str | None = None, prefix: str | None = None, *,
            credentials: str | None = None, ca: str | None = None, cert: str | None = None,
            key: str | None = None) -> Context:
    """Each setting from its flag, else its environment variable, else the context file.
    The context's credentials and TLS files are its server's: they are taken only when the
    URL is the context's too (not another server's, named by a flag or the environment)."""
    saved = Context()
    path = context_path()
    if path.exists():
        saved = msgspec.json.decode(path.read_bytes(), type=Context)
    url = nats_url or os.environ.get(NATS_URL_ENV) or saved.nats_url
    ours = saved if url == saved.nats_url else Context()

    def chosen(flag: str | None, env: str, remembered: str) -> str:
        return flag or os.environ.get(env) or remembered

    return Context(
        nats_url=url,
        prefix=prefix or os.environ.get(PREFIX_ENV) or saved.prefix,
        data_dir=saved.data_dir,
        credentials=chosen(credentials, CREDENTIALS_ENV, ours.credentials),
        ca=chosen(ca, CA_ENV, ours.ca),
        cert=chosen(cert, CERT_ENV, ours.cert),
        key=chosen(key, KEY_ENV, ours.key),
    )
