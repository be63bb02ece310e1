"""Where a benchmark's CPU goes while its clock runs, read from `/proc` (Linux).

A rate is bounded twice over: a process of one thread (the control plane's event loop) by
one core, and every process on the machine together by all of its cores. Dividing each by
the CPU one operation costs there gives the rate at which that bound would be full: what a
ratio to the raw layer could at most be, at this code's cost, on this machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.common import Figures

CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
"""The clock ticks `/proc` counts CPU time in, per second."""


@dataclass(frozen=True)
class CpuReading:
    """CPU seconds spent so far: by the whole machine (every core, busy only), and by each
    process named; and how many cores the machine's figure is of."""

    machine: float
    processes: dict[str, float]
    cores: int


def read_cpu(pids: Mapping[str, int]) -> CpuReading | None:
    """The CPU spent so far, by the machine and by each of `pids` (by role); None where
    `/proc` cannot tell (not Linux, or a process gone)."""
    try:
        machine = busy_seconds(Path("/proc/stat").read_text().split("\n", 1)[0])
        processes = {role: _process_seconds(pid) for role, pid in pids.items()}
    except (OSError, ValueError, IndexError):
        return None
    return CpuReading(machine, processes, os.cpu_count() or 1)


def busy_seconds(cpu_line: str) -> float:
    """From `/proc/stat`'s first line (every core added up: `cpu  user nice system idle
    iowait irq softirq steal guest guest_nice`), the seconds spent running: user, nice,
    system, irq and softirq. Not idle, I/O wait, nor steal (the hypervisor running someone
    else); guest time is counted in user and nice already."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(t) for t in cpu_line.split()[1:8])
    return (user + nice + system + irq + softirq) / CLOCK_TICKS_PER_SECOND


def _process_seconds(pid: int) -> float:
    # Fields after the command's name (which may hold spaces, in parentheses): utime is the
    # 14th of the line, stime the 15th.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_SECOND


def cpu_figures(before: CpuReading | None, after: CpuReading | None, count: int,
                seconds: float, *, raw_per_s: float, single_threaded: str) -> Figures:
    """Per operation, in ms of CPU: `cpu_ms_machine` and `cpu_ms_<role>`; how busy each was
    (`busy_machine` a share of every core, `busy_<role>` of one); and `ceiling_per_s`, the
    rate at which the first bound is full (the machine's cores, or the one core of
    `single_threaded`), with `ceiling_ratio`, that rate over the raw layer's. Nothing where
    `/proc` could not tell."""
    if before is None or after is None or count < 1 or seconds <= 0:
        return {}
    n = after.cores
    machine = after.machine - before.machine
    figures: Figures = {"cores": n, "cpu_ms_machine": round(machine / count * 1000, 3),
                        "busy_machine": round(machine / (seconds * n), 3)}
    ceilings = [n * count / machine] if machine > 0 else []
    for role, spent in after.processes.items():
        used = spent - before.processes[role]
        figures[f"cpu_ms_{role}"] = round(used / count * 1000, 3)
        figures[f"busy_{role}"] = round(used / seconds, 3)
        if role == single_threaded and used > 0:
            ceilings.append(count / used)
    if ceilings:
        figures["ceiling_per_s"] = round(min(ceilings), 1)
        if raw_per_s > 0:
            figures["ceiling_ratio"] = round(min(ceilings) / raw_per_s, 3)
    return figures
