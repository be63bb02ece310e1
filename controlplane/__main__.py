"""`python -m controlplane run`: the control-plane process (`virtbus up` starts it)."""

from __future__ import annotations

import argparse
import os
import sys

from controlplane.defaults import NODE_MONITOR_GRACE_SECONDS
from controlplane.service import run
from events.connect import NATS_FAILURES, add_arguments, stopped_by
from events.logs import configure
from events.subjects import Layout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlplane")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the control plane")
    add_arguments(p)
    p.add_argument("--replicas", type=int, default=int(os.environ.get("VIRTBUS_REPLICAS", "1")),
                   help="stream replicas (3 on a NATS cluster; env VIRTBUS_REPLICAS)")
    p.add_argument("--node-grace", type=float, default=NODE_MONITOR_GRACE_SECONDS)
    args = parser.parse_args(argv)
    configure()
    try:
        return run(args.nats_url, Layout(args.prefix), replicas=args.replicas,
                   node_grace_seconds=args.node_grace)
    except NATS_FAILURES as e:  # a malformed URL; NATS lost past what the service rides out
        return stopped_by(e)


if __name__ == "__main__":
    sys.exit(main())
