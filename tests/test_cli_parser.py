"""The CLI's argument handling, without a server: connection options before or after the
command (as the README writes `virtbus up --nats-url U`), and cluster-wide kinds looked up
in no namespace."""

from __future__ import annotations

import pytest

from controlplane.user.cli import parser, scope
from projections.query import resolve_kind


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
    assert scope(resolve_kind(short), "team") == namespace
