"""Commands end to end: C concurrent clients each submit `apply` commands (a new Halted VM
each) to a real control plane, its own process, and await every outcome.

    python -m bench.commands --clients 50 --commands 2000
    python -m bench.commands --clients 1 --commands 500     # latency, one at a time

In the same run, on the same server: the raw layers beneath, awaited `js.publish` on a plain
stream (one at a time) and a core NATS request/reply round trip, measured just before and
just after the timed window (the control plane up and idle), their mean the figure: a
machine whose speed drifts moves both sides of the ratio. One JSON line: `commands`,
`clients`, `seconds`, `per_s`, `p50_ms`, `p99_ms`, `raw_publish_per_s` (with
`raw_publish_per_s_before` and `_after`), `raw_rtt_ms`, `ratio` (per_s / raw_publish_per_s),
`p50_rtts` and `p99_rtts` (latency in raw round trips); and, read from `/proc` while the
clock runs (`bench.cpu`), the CPU a command costs the machine, the control plane,
nats-server (when started here) and the clients (`cpu_ms_*`), how busy each was
(`busy_*`), and `ceiling_per_s` / `ceiling_ratio`: the rate at which the machine's cores or
the control plane's one would be full.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import nats
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig

from bench.common import (
    Figures,
    nats_server_process,
    percentile,
    positive,
    raw_stream,
    raw_subject,
)
from bench.cpu import CpuReading, cpu_figures, read_cpu
from controlplane.user.client import Client
from events.jetstream.streams import ensure_all
from events.language.subjects import Layout

RAW_SAMPLES = 2000
WARM_UP = 20
"""Commands sent, one at a time, before the clock starts: connections and code warm."""
ROOT = Path(__file__).resolve().parent.parent


def manifest(name: str) -> dict[str, object]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": "bench"},
            "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {
                "resources": {"requests": {"memory": "64Mi"}}, "devices": {}}}}}}


async def raw_layers(url: str, layout: Layout) -> tuple[float, float]:
    """(awaited js.publish per second, request/reply round trip in ms), measured now."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=raw_stream(layout),
                                         subjects=[raw_subject(layout, ">")],
                                         storage=StorageType.FILE))
        subject = raw_subject(layout, "p")
        began = time.perf_counter()
        for _ in range(RAW_SAMPLES):
            await js.publish(subject, b"x" * 200)
        publish_per_s = RAW_SAMPLES / (time.perf_counter() - began)

        async def echo(msg: Msg) -> None:
            await msg.respond(msg.data)

        sub = await nc.subscribe(f"{layout.prefix}.echo", cb=echo)
        began = time.perf_counter()
        for _ in range(RAW_SAMPLES):
            await nc.request(f"{layout.prefix}.echo", b"x" * 200, timeout=5)
        rtt_ms = (time.perf_counter() - began) / RAW_SAMPLES * 1000
        await sub.unsubscribe()
        await js.delete_stream(raw_stream(layout))
        return publish_per_s, rtt_ms
    finally:
        await nc.close()


class Run(NamedTuple):
    seconds: float
    """For all commands."""
    latencies: list[float]
    """Each command's submit -> outcome, in seconds."""
    cpu_before: CpuReading | None
    cpu_after: CpuReading | None
    raw_before: tuple[float, float]
    raw_after: tuple[float, float]
    """`raw_layers` just before the clock started and just after it stopped."""


async def drive(url: str, layout: Layout, clients: int, commands: int,
                pids: dict[str, int]) -> Run:
    connected = [await Client.connect(url, layout.prefix, actor=f"user:bench{i}")
                 for i in range(clients)]
    latencies: list[float] = []

    async def client(vb: Client, names: Iterator[str]) -> None:
        for name in names:
            began = time.perf_counter()
            await vb.run(vb.command("VirtualMachine", "apply", manifest=manifest(name)))
            latencies.append(time.perf_counter() - began)

    try:
        await client(connected[0], iter([f"warm-{n}" for n in range(WARM_UP)]))
        latencies.clear()
        names = iter([f"vm-{n}" for n in range(commands)])
        raw_before = await raw_layers(url, layout)
        cpu_before = read_cpu(pids)
        began = time.perf_counter()
        await asyncio.gather(*[client(vb, names) for vb in connected])
        seconds = time.perf_counter() - began
        cpu_after = read_cpu(pids)
        return Run(seconds, latencies, cpu_before, cpu_after, raw_before,
                   await raw_layers(url, layout))
    finally:
        for vb in connected:
            await vb.close()


async def measure(url: str, server_pid: int | None, clients: int, commands: int) -> Figures:
    layout = Layout("bench" + uuid.uuid4().hex[:8])
    nc = await nats.connect(url)
    await ensure_all(nc.jetstream(), layout)
    await nc.close()
    env = {**os.environ, "VIRTBUS_LOG_LEVEL": "warning", "VIRTBUS_LOG_FORMAT": "json"}
    plane = subprocess.Popen([sys.executable, "-m", "controlplane", "run", "--nats-url", url,
                              "--prefix", layout.prefix], cwd=ROOT, env=env)
    try:
        pids = {"controlplane": plane.pid, "clients": os.getpid()}
        if server_pid is not None:
            pids["nats_server"] = server_pid
        run = await drive(url, layout, clients, commands, pids)
    finally:
        plane.terminate()
        plane.wait(timeout=30)
    per_s = commands / run.seconds
    p50_ms = percentile(run.latencies, 50) * 1000
    p99_ms = percentile(run.latencies, 99) * 1000
    raw_publish_per_s = (run.raw_before[0] + run.raw_after[0]) / 2
    raw_rtt_ms = (run.raw_before[1] + run.raw_after[1]) / 2
    return {"commands": commands, "clients": clients, "seconds": round(run.seconds, 3),
            "per_s": round(per_s, 1), "p50_ms": round(p50_ms, 3), "p99_ms": round(p99_ms, 3),
            "raw_publish_per_s": round(raw_publish_per_s, 1),
            "raw_publish_per_s_before": round(run.raw_before[0], 1),
            "raw_publish_per_s_after": round(run.raw_after[0], 1),
            "raw_rtt_ms": round(raw_rtt_ms, 4),
            "ratio": round(per_s / raw_publish_per_s, 3),
            "p50_rtts": round(p50_ms / raw_rtt_ms, 1), "p99_rtts": round(p99_ms / raw_rtt_ms, 1),
            **cpu_figures(run.cpu_before, run.cpu_after, commands, run.seconds,
                          raw_per_s=raw_publish_per_s, single_threaded="controlplane")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=positive, default=50)
    p.add_argument("--commands", type=positive, default=2000)
    p.add_argument("--nats-url", default=None,
                   help="an existing NATS server (default: start one in a temp dir)")
    args = p.parse_args()
    with nats_server_process(args.nats_url) as (url, server_pid):
        figures = asyncio.run(measure(url, server_pid, args.clients, args.commands))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
