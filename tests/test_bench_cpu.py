"""The CPU figures `bench.commands` prints: per command, how busy, and the ceiling."""

from __future__ import annotations

import os

from bench.cpu import CLOCK_TICKS_PER_SECOND, CpuReading, busy_seconds, cpu_figures, read_cpu


def test_the_ceiling_is_the_first_bound_to_fill() -> None:
    before = CpuReading(10.0, {"controlplane": 1.0, "clients": 2.0}, cores=2)
    after = CpuReading(11.5, {"controlplane": 1.9, "clients": 2.3}, cores=2)
    figures = cpu_figures(before, after, 1000, 1.0, raw_per_s=2000,
                          single_threaded="controlplane")
    assert figures == {
        "cores": 2, "cpu_ms_machine": 1.5, "busy_machine": 0.75,
        "cpu_ms_controlplane": 0.9, "busy_controlplane": 0.9,
        "cpu_ms_clients": 0.3, "busy_clients": 0.3,
        # the machine would fill at 2 cores / 1.5 ms = 1,333/s, the control plane's one
        # core first, at 1 / 0.9 ms
        "ceiling_per_s": 1111.1, "ceiling_ratio": 0.556,
    }
    # A machine that fills first: its cores bound the rate.
    busier = CpuReading(12.5, after.processes, cores=2)
    assert cpu_figures(before, busier, 1000, 1.0, raw_per_s=2000,
                       single_threaded="controlplane")["ceiling_per_s"] == 800.0


def test_nothing_is_claimed_where_proc_could_not_tell() -> None:
    reading = CpuReading(1.0, {"controlplane": 0.5}, cores=2)
    assert cpu_figures(None, reading, 10, 1.0, raw_per_s=1, single_threaded="x") == {}
    assert cpu_figures(reading, None, 10, 1.0, raw_per_s=1, single_threaded="x") == {}
    assert read_cpu({"gone": 2 ** 22 + 1}) is None  # above Linux's largest pid


def test_this_process_is_read_from_proc() -> None:
    first = read_cpu({"me": os.getpid()})
    assert first is not None
    sum(i * i for i in range(3_000_000))  # CPU the reading must see (one tick is 10 ms)
    second = read_cpu({"me": os.getpid()})
    assert second is not None
    assert second.processes["me"] > first.processes["me"]
    # the machine's busy time holds this process's (to a tick, read a moment apart)
    assert second.machine - first.machine >= \
        second.processes["me"] - first.processes["me"] - 0.02


def test_idle_io_wait_steal_and_guest_are_not_counted_as_running() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice (guest is in user)
    line = "cpu  100 1 50 9000 700 2 5 3 40 0"
    assert busy_seconds(line) == 158 / CLOCK_TICKS_PER_SECOND
