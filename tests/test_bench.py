"""The benchmarks run end to end and end with their JSON figures; their speed is not tested."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEADLINE = ("events", "seconds", "per_s", "raw_per_s", "ratio")


@pytest.mark.parametrize("module", ["bench.append", "bench.replay"])
def test_bench_prints_figures(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--events", "200"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for key in HEADLINE:
        assert isinstance(figures[key], int | float) and figures[key] > 0, (key, figures)
    assert figures["events"] == 200


def test_bench_commands_prints_figures() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.commands", "--clients", "3", "--commands", "30"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("per_s", "p50_ms", "p99_ms", "raw_publish_per_s", "raw_publish_per_s_before",
                "raw_publish_per_s_after", "raw_rtt_ms", "ratio"):
        assert isinstance(figures[key], int | float) and figures[key] > 0, (key, figures)
    assert (figures["commands"], figures["clients"]) == (30, 3)
    # the raw rate is the mean of one measured just before the clock and one just after
    assert figures["raw_publish_per_s"] == pytest.approx(
        (figures["raw_publish_per_s_before"] + figures["raw_publish_per_s_after"]) / 2, abs=0.1)
    # CPU while the clock ran, read from /proc (a short run may see no tick of a process)
    for key in ("cpu_ms_machine", "cpu_ms_controlplane", "cpu_ms_clients",
                "cpu_ms_nats_server", "busy_machine", "busy_controlplane"):
        assert isinstance(figures[key], int | float) and figures[key] >= 0, (key, figures)
    assert figures["cores"] == os.cpu_count()


def test_bench_scheduling_prints_figures() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.scheduling", "--nodes", "10", "--placed", "20",
         "--decisions", "50"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("constrained_decision_us_p50", "plain_decision_us_p50", "raw_decode_us",
                "ratio"):
        assert isinstance(figures[key], int | float) and figures[key] > 0, (key, figures)
    assert figures["constrained_placed"] == figures["plain_placed"] == 50


def test_bench_scale_prints_figures() -> None:
    """`virtbus up`'s processes with a fleet, at a size CI runs in a few seconds."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.scale", "--nodes", "5", "--vms", "50", "--rate", "50",
         "--timeout", "120"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert (figures["nodes"], figures["vms"]) == (5, 50)
    assert figures["events"] > 50 * 4  # each VM: created, its VMI created, scheduled, Running
    for key in ("all_running_s", "decisions_per_s", "create_to_running_p50_ms",
                "create_to_running_p99_ms", "peak_rss_mb_controlplane", "peak_rss_mb_fleet",
                "peak_rss_mb_projections", "peak_rss_mb_nats", "restart_live_s_snapshots",
                "restart_live_s_no_snapshots", "raw_log_read_s", "get_at_ms",
                "get_at_ms_no_snapshots", "get_at_one_ms", "watch_since_first_ms",
                *(f"step_{step}_{figure}_ms"
                  for step in ("vm_to_vmi", "vmi_to_scheduled", "scheduled_to_launch",
                               "launch_to_running") for figure in ("p50", "max"))):
        assert isinstance(figures[key], int | float) and figures[key] > 0, (key, figures)
    # the restarted control plane folded from the benchmark's snapshot (or a newer one)
    assert figures["restart_start_sequence"] > figures["snapshot_sequence"] > 0, figures
