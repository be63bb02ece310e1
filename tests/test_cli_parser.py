"""The CLI's argument handling, without a server: connection options before or after the
command (as the README writes `virtbus up --nats-url U`), cluster-wide kinds looked up in no
namespace, every command's handler found, and parsing that imports none of what commands run
(so `virtbus --help` starts fast)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from controlplane.user.actions import HANDLERS, scope
from controlplane.user.cli import parser
from events.api.kinds import resolve

PARSING_NEEDS = {"controlplane", "controlplane.defaults", "controlplane.user",
                 "controlplane.user.cli"}
"""The only controlplane modules that parsing may load: constants shown in `--help`."""
RUNNING_NEEDS = ("nats", "aiohttp", "structlog", "yaml", "projections")
"""What only running a command needs: loading one of these for `--help` is the slow start."""


@pytest.mark.parametrize("argv", [
    ["up", "--nats-url", "nats://a:1", "--prefix", "p"],
    ["--nats-url", "nats://a:1", "--prefix", "p", "up"],
])
def test_connection_options_go_before_or_after_the_command(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    assert (args.command, args.nats_url, args.prefix) == ("up", "nats://a:1", "p")


def test_an_option_after_the_command_wins_and_unset_ones_keep_the_default() -> None:
    args = parser().parse_args(["--as", "user:a", "get", "vm", "--as", "user:b"])
    assert (args.actor, args.nats_url, args.prefix) == ("user:b", None, None)


@pytest.mark.parametrize(("short", "namespace"), [
    ("vm", "team"), ("vmi", "team"), ("node", ""), ("hco", ""), ("kubevirt", "")])
def test_cluster_wide_kinds_are_looked_up_in_no_namespace(short: str, namespace: str) -> None:
    assert scope(resolve(short).kind, "team") == namespace


def test_every_command_names_its_handler() -> None:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    runs = {name: command.get_default("run") for name, command in sub.choices.items()}
    assert {name for name, run in runs.items() if run is None} == {"up", "domxml", "node"}
    assert {run for run in runs.values() if run is not None} == set(HANDLERS)


def test_parsing_imports_nothing_a_command_runs_with() -> None:
    """In a fresh interpreter: this process has imported everything already."""
    probe = ("import json, sys\n"
             "from controlplane.user.cli import parser\n"
             "parser().format_help()\n"
             "print(json.dumps(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=60)
    loaded = json.loads(done.stdout)
    assert [m for m in loaded if m.split(".")[0] in RUNNING_NEEDS] == []
    assert {m for m in loaded if m.split(".")[0] == "controlplane"} <= PARSING_NEEDS
