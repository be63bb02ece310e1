"""virtbus at the size of a cluster: `virtbus up`'s processes (control plane, read service, a
fleet of simulated nodes) on a fresh nats-server, VMs applied at a steady rate.

    python -m bench.scale --nodes 100 --vms 10000 --rate 200

One JSON line: `all_running_s` (first apply to last VMI Running), `decisions_per_s`
(VMIs scheduled per second while scheduling went on), `create_to_running_p50_ms`/`p95`/`p99`
(apply sent to its VMI Running, as the log says it), `max_controller_lag_ms` (the largest
delay between an event and the control plane acting on it: from the event's time in the log
to the time of the controller's answering event in the log, VM created to its VMI created
and VMI created to it scheduled, or to the dispatcher's launch reaching the node stream,
VMI scheduled to its launch published; the answer's time is when it was decided, so a
command waiting to be written counts), `max_dispatch_lag_ms` (the last alone),
`step_<step>_p50_ms` / `_max_ms` (each step's median and largest: VM created to VMI created, VMI
created to scheduled, scheduled to launch published, launch to Running),
`peak_rss_mb_<process>` (controlplane, projections, fleet, nats, bench), `nodes_not_ready`
(NotReady transitions during the run: every simulated node is healthy, so each is false),
`events` in the log, the control plane's cold restart to live with and without snapshots
(`restart_live_s_snapshots`, `restart_live_s_no_snapshots`; `snapshot_sequence`, the one
the benchmark wrote before, and `restart_start_sequence`, where the control plane started to
fold the log, one past the snapshot it used), `get_at_ms` /
`get_at_ms_no_snapshots` (every VM, all pages, the worst of a few past instants; null when
one went unanswered for the client's whole wait), `get_at_one_ms` (one VM by name, as
`virtbus get vm NAME --at` asks), `watch_since_first_ms` (a resumed watch to its first change),
and the raw layer beneath a restart: `raw_log_read_s`, reading every message of the log (Direct Get
pages, nothing decoded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError

from bench.common import Figures, percentile, positive
from controlplane.up import Child, UpOptions, children
from controlplane.user.client import Client
from events.api.resources import quantity
from events.jetstream.connect import Access
from events.jetstream.directget import read_all
from events.jetstream.server import EmbeddedNats, free_port
from events.jetstream.streams import prepare_streams
from events.language.codec import Event
from events.language.kinds.nodes import NodeNotReady
from events.language.kinds.vm import (
    VirtualMachineCreated,
    VirtualMachineInstanceCreated,
    VirtualMachineInstancePhaseChanged,
    VirtualMachineInstanceScheduled,
)
from events.language.messages import NodeCommand
from events.language.subjects import Layout, split_aggregate_id
from events.runtime.logs import configure
from projections import audit
from projections.follower import follow, head
from projections.snapshots import Snapshots

NAMESPACE = "scale"
POLL_SECONDS = 0.05
"""How often the bench looks at what it waits for (a process's log, the cluster)."""
_decode_node_command = msgspec.msgpack.Decoder(NodeCommand).decode
LIVE_LINE = '"control loop live"'
REPLAYING_LINE = '"control loop replaying"'
INSTANTS = 4
"""Past instants `get --at` is timed at, spread over the log."""


def manifest(name: str) -> dict[str, Any]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {
                "cpu": {"cores": 1}, "resources": {"requests": {"memory": "64Mi"}},
                "devices": {}}}}}}


class Timeline:
    """What the log says of each VM, as it arrives: the controllers' timestamps, and when
    this process saw its VMI Running."""

    def __init__(self) -> None:
        self.vm_created: dict[str, datetime] = {}
        self.vmi_created: dict[str, datetime] = {}
        self.scheduled: dict[str, datetime] = {}
        self.running: dict[str, float] = {}
        self.running_at: dict[str, datetime] = {}
        self.launched: dict[str, datetime] = {}
        self.nodes_not_ready = 0
        """NotReady transitions: every node of the fleet is healthy, so each is a false one."""
        self.changed = asyncio.Event()

    async def on_event(self, _sequence: int, event: Event) -> None:
        if isinstance(event, NodeNotReady):
            self.nodes_not_ready += 1
        _, namespace, name = split_aggregate_id(event.originator_id)
        if namespace != NAMESPACE:
            return
        if isinstance(event, VirtualMachineCreated):
            self.vm_created.setdefault(name, event.timestamp)
        elif isinstance(event, VirtualMachineInstanceCreated):
            self.vmi_created.setdefault(name, event.timestamp)
        elif isinstance(event, VirtualMachineInstanceScheduled):
            self.scheduled.setdefault(name, event.timestamp)
        elif isinstance(event, VirtualMachineInstancePhaseChanged) and event.phase == "Running":
            self.running.setdefault(name, time.monotonic())
            self.running_at.setdefault(name, event.timestamp)
            self.changed.set()

    async def on_node_work(self, msg: Msg) -> None:
        """A node command as the dispatcher published it: launches are timed."""
        command = _decode_node_command(msg.data)
        if command.verb == "launch" and command.namespace == NAMESPACE:
            self.launched.setdefault(command.name, datetime.now(UTC))

    def lags(self) -> list[float]:
        """Seconds from each event to the controllers' answer to it."""
        return [*_delays(self.vm_created, self.vmi_created),
                *_delays(self.vmi_created, self.scheduled), *self.dispatch_lags()]

    def steps(self) -> dict[str, list[float]]:
        """Seconds each VM spent in each step of its way to Running, as the log times them
        (the launch as the node stream got it): where a run's time goes."""
        return {"vm_to_vmi": _delays(self.vm_created, self.vmi_created),
                "vmi_to_scheduled": _delays(self.vmi_created, self.scheduled),
                "scheduled_to_launch": self.dispatch_lags(),
                "launch_to_running": _delays(self.launched, self.running_at)}

    def dispatch_lags(self) -> list[float]:
        return _delays(self.scheduled, self.launched)

    def decisions_per_s(self) -> float:
        times = sorted(self.scheduled.values())
        seconds = (times[-1] - times[0]).total_seconds() if len(times) > 1 else 0.0
        return len(times) / seconds if seconds > 0 else 0.0


def _delays(events: dict[str, datetime], answers: dict[str, datetime]) -> list[float]:
    return [(answers[n] - t).total_seconds() for n, t in events.items() if n in answers]


async def until(probe: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL_SECONDS)  # the bench's own polling, not synchronisation


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


async def apply_steadily(vb: Client, count: int, rate: float, sent: dict[str, float],
                         timeout: float) -> None:
    """`count` VMs, one every 1/`rate` s, each apply's outcome awaited (up to `timeout`: a
    control plane behind takes longer to answer than a client's default wait) in its own
    task."""
    began = time.monotonic()
    tasks = []
    for i in range(count):
        delay = began + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # the pace of the load, not synchronisation
        name = f"vm-{i:05d}"
        sent[name] = time.monotonic()
        tasks.append(asyncio.ensure_future(apply_one(vb, manifest(name), timeout)))
    await asyncio.gather(*tasks)


async def apply_one(vb: Client, document: dict[str, Any], timeout: float) -> None:
    command = vb.command("VirtualMachine", "apply", manifest=document)
    outcome = await vb.run(command, check=False, timeout=timeout)
    if not outcome.accepted:
        raise SystemExit(f"apply refused: {outcome.reason}")


async def snapshot_at_checkpoint(vb: Client, layout: Layout) -> int:
    """Write a snapshot at the dispatcher's checkpoint, no later than it as the read service
    writes them, so the restarted control plane may start from it; its sequence."""
    checkpoint = await (await vb.nc.jetstream().key_value(
        layout.checkpoints_bucket)).get("dispatcher")
    sequence = int(checkpoint.value or b"0")
    await Snapshots(vb.nc, layout).save(await audit.state_at(vb.nc, layout, sequence))
    return sequence


async def restart_to_live(child: Child, timeout: float) -> tuple[float, int]:
    """Kill the control plane (SIGKILL), start it again: seconds until it says it is live,
    and the sequence it folded the log from (1: no snapshot was used)."""
    assert child.process is not None
    child.process.send_signal(signal.SIGKILL)
    child.process.wait()
    lives = child.log_path.read_text().count(LIVE_LINE)
    began = time.monotonic()
    child.start()

    async def live() -> bool:
        return child.log_path.read_text().count(LIVE_LINE) > lives

    await until(live, timeout, "the control plane live")
    seconds = time.monotonic() - began
    replaying = [line for line in child.log_path.read_text().splitlines()
                 if REPLAYING_LINE in line]
    return seconds, int(json.loads(replaying[-1]).get("start", 0)) if replaying else 0


async def get_at_ms(vb: Client, instants: list[int], name: str = "") -> float | None:
    """The slowest `get --at` of the instants (every VM at that sequence, all its pages, or
    the one VM `name`); None when one went unanswered for the client's whole wait
    (`QUERY_TIMEOUT_SECONDS`)."""
    slowest = 0.0
    for sequence in instants:
        began = time.perf_counter()
        try:
            await vb.query_at(sequence, "VirtualMachine", NAMESPACE if name else "", name)
        except (TimeoutError, NatsTimeoutError):
            return None
        slowest = max(slowest, (time.perf_counter() - began) * 1000)
    return slowest


async def watch_first_ms(vb: Client, since: int) -> float:
    """A watch resumed at `since`: milliseconds until its first change."""
    began = time.perf_counter()
    async for _ in vb.watch("VirtualMachineInstance", since=since):
        break
    return (time.perf_counter() - began) * 1000


async def measure(args: argparse.Namespace, data: Path, server: EmbeddedNats) -> Figures:
    url = server.url
    layout = Layout("scale" + uuid.uuid4().hex[:8])
    await prepare_streams(Access(url), layout, 1)
    opts = UpOptions(data_dir=data, nodes=args.nodes, prefix=layout.prefix, fleet=True,
                     node_cpus=args.cpu, node_memory=int(quantity(args.memory)))
    logs = data / "logs"
    logs.mkdir(exist_ok=True)
    procs = {c.name: c for c in children(opts, url, logs, free_port())}
    for child in procs.values():
        child.start()
    stop = asyncio.Event()
    try:
        async with await Client.connect(url, layout.prefix, actor="user:bench") as vb:
            async def nodes_ready() -> bool:
                nodes = await vb.query("Node")
                ready = [n for n in nodes for c in n["status"]["conditions"]
                         if c["type"] == "Ready" and c["status"] == "True"]
                return len(ready) == args.nodes and bool(await vb.query("KubeVirt"))

            await until(nodes_ready, args.timeout, "every node Ready")
            timeline = Timeline()
            node_work = await vb.nc.subscribe(layout.node_work, cb=timeline.on_node_work)
            following = asyncio.ensure_future(follow(
                vb.nc, layout, timeline.on_event, start=await head(vb.nc, layout) + 1,
                stop=stop))
            sent: dict[str, float] = {}
            began = time.monotonic()
            await apply_steadily(vb, args.vms, args.rate, sent, args.timeout)

            async def all_running() -> bool:
                return len(timeline.running) >= len(sent)

            await until(all_running, args.timeout, "every VMI Running")
            all_running_s = max(timeline.running.values()) - began
            latencies = [timeline.running[n] - t for n, t in sent.items()]
            pids = {name: c.process.pid for name, c in procs.items() if c.process is not None}
            pids |= {"nats": server.process.pid if server.process else 0, "bench": os.getpid()}
            rss = {f"peak_rss_mb_{name}": peak_rss_mb(pid) for name, pid in pids.items()}
            stop.set()
            await following
            await node_work.unsubscribe()

            last = await head(vb.nc, layout)
            raw_began = time.perf_counter()
            await read_all(vb.nc, layout.events_stream, layout.events_filter())
            raw_log_read_s = time.perf_counter() - raw_began
            instants = [max(1, last * (i + 1) // INSTANTS) for i in range(INSTANTS)]
            snapshot_sequence = await snapshot_at_checkpoint(vb, layout)
            restart_snapshots, restart_start = await restart_to_live(procs["controlplane"],
                                                                     args.timeout)
            get_at = await get_at_ms(vb, instants)
            get_at_one = await get_at_ms(vb, instants, "vm-00000")
            watch_first = await watch_first_ms(vb, max(1, last - 100))
            await vb.nc.jetstream().purge_stream(layout.read_snapshots_stream)
            restart_plain, _ = await restart_to_live(procs["controlplane"], args.timeout)
            get_at_plain = await get_at_ms(vb, instants)
    finally:
        stop.set()
        for child in reversed(procs.values()):
            child.stop()
    lags, dispatch_lags = timeline.lags(), timeline.dispatch_lags()
    return {
        "nodes": args.nodes, "vms": args.vms, "rate": args.rate, "events": last,
        "all_running_s": round(all_running_s, 2),
        "decisions_per_s": round(timeline.decisions_per_s(), 1),
        **{f"create_to_running_p{q}_ms": round(percentile(latencies, q) * 1000, 1)
           for q in (50, 95, 99)},
        "max_controller_lag_ms": round(max(lags) * 1000, 1) if lags else 0.0,
        "max_dispatch_lag_ms": round(max(dispatch_lags) * 1000, 1) if dispatch_lags else 0.0,
        "nodes_not_ready": timeline.nodes_not_ready,
        **{f"step_{step}_{figure}_ms": round(value * 1000, 1)
           for step, seconds in timeline.steps().items() if seconds
           for figure, value in (("p50", percentile(seconds, 50)), ("max", max(seconds)))},
        **rss,
        "restart_live_s_snapshots": round(restart_snapshots, 2),
        "restart_start_sequence": restart_start, "snapshot_sequence": snapshot_sequence,
        "restart_live_s_no_snapshots": round(restart_plain, 2),
        "raw_log_read_s": round(raw_log_read_s, 3),
        "get_at_ms": _rounded(get_at), "get_at_ms_no_snapshots": _rounded(get_at_plain),
        "get_at_one_ms": _rounded(get_at_one),
        "watch_since_first_ms": round(watch_first, 1),
    }


def _rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=positive, default=100)
    p.add_argument("--vms", type=positive, default=10000)
    p.add_argument("--rate", type=float, default=200.0, help="VMs applied per second")
    p.add_argument("--cpu", type=positive, default=64, help="CPUs of each simulated node")
    p.add_argument("--memory", default="256Gi", help="memory of each simulated node")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds any one wait may take before the run fails")
    args = p.parse_args()
    configure(level="warning")
    with tempfile.TemporaryDirectory(prefix="virtbus-scale-") as tmp, \
            EmbeddedNats(Path(tmp) / "nats") as server:
        figures = asyncio.run(measure(args, Path(tmp), server))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
