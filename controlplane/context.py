"""Where a CLI command finds virtbus: flag, then `VIRTBUS_NATS_URL`, then the context file
that `virtbus up` wrote, then the default local server."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from events.connect import DEFAULT_URL, NATS_URL_ENV, PREFIX_ENV
from events.subjects import DEFAULT_PREFIX


class Context(msgspec.Struct, frozen=True, kw_only=True):
    nats_url: str = DEFAULT_URL
    prefix: str = DEFAULT_PREFIX
    data_dir: str = ""


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


def resolve(nats_url: str | None = None, prefix: str | None = None) -> Context:
    saved = Context()
    path = context_path()
    if path.exists():
        saved = msgspec.json.decode(path.read_bytes(), type=Context)
    return Context(
        nats_url=nats_url or os.environ.get(NATS_URL_ENV) or saved.nats_url,
        prefix=prefix or os.environ.get(PREFIX_ENV) or saved.prefix,
        data_dir=saved.data_dir,
    )
