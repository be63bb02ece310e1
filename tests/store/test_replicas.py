"""`virtbus up --replicas 3` on an installation made with one replica raises every stream
and KV bucket to three, on a real three-server cluster; the store's own processes, which do
not know the installation's replicas, never lower them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from events.jetstream.connect import connect
from events.jetstream.datastore import JetStreamDatastore
from events.jetstream.store import JetStreamApplicationRecorder
from events.jetstream.streams import ensure_all
from events.language.subjects import Layout
from tests.natsserver import cluster, jetstream_ready

LAYOUT = Layout("vbr")
NAMES = [LAYOUT.events_stream, LAYOUT.commands_stream, LAYOUT.node_stream,
         LAYOUT.reports_stream, LAYOUT.dead_letter_stream, *(f"KV_{bucket}" for bucket in (
             LAYOUT.heartbeats_bucket, LAYOUT.leases_bucket, LAYOUT.checkpoints_bucket,
             LAYOUT.outcomes_bucket))]
"""Every stream and bucket `ensure_all` makes (a bucket is the stream `KV_<bucket>`)."""


async def test_replicas_are_raised_on_an_existing_installation(tmp_path: Path) -> None:
    layout = LAYOUT
    with cluster(tmp_path) as servers:
        url = ",".join(s.url for s in servers)
        nc = await connect(url, "test-replicas")
        try:
            js = nc.jetstream()
            await jetstream_ready(js)
            await ensure_all(js, layout, 1)
            await ensure_all(js, layout, 3)
            store = await asyncio.to_thread(JetStreamDatastore, url, layout)
            await asyncio.to_thread(JetStreamApplicationRecorder, store)  # replicas unknown
            await asyncio.to_thread(store.close)
            replicas = {name: (await js.stream_info(name)).config.num_replicas
                        for name in NAMES}
        finally:
            await nc.close()
    assert replicas == dict.fromkeys(NAMES, 3)
