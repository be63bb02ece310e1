"""`python -m controlplane run`: the control-plane process (`virtbus up` starts it);
`python -m controlplane prepare`: the streams and buckets it needs, made by the stream
administrator before it starts (a deploy job; `virtbus up` does it itself)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from controlplane.defaults import NODE_MONITOR_GRACE_SECONDS
from controlplane.service import run
from events.api.errors import InvalidSpec
from events.authorization.policy import add_policy_argument, load_policy
from events.jetstream.connect import NATS_FAILURES, access_from_args, add_arguments, stopped_by
from events.jetstream.streams import prepare_streams
from events.language.subjects import Layout
from events.runtime.logs import configure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlplane")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the control plane")
    add_arguments(p)
    p.add_argument("--replicas", type=int, default=int(os.environ.get("VIRTBUS_REPLICAS", "1")),
                   help="stream replicas (3 on a NATS cluster; env VIRTBUS_REPLICAS)")
    p.add_argument("--node-grace", type=float, default=NODE_MONITOR_GRACE_SECONDS)
    add_policy_argument(p)
    prepare = sub.add_parser("prepare", help="create or bring up to date every stream and "
                                             "bucket (as the stream administrator), then exit")
    add_arguments(prepare)
    prepare.add_argument("--replicas", type=int,
                         default=int(os.environ.get("VIRTBUS_REPLICAS", "1")))
    args = parser.parse_args(argv)
    configure()
    if args.command == "prepare":
        try:
            asyncio.run(prepare_streams(access_from_args(args), Layout(args.prefix),
                                        args.replicas))
        except NATS_FAILURES as e:
            return stopped_by(e)
        return 0
    try:
        policy = load_policy(args.policy)
    except InvalidSpec as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return run(access_from_args(args), Layout(args.prefix), replicas=args.replicas,
                   node_grace_seconds=args.node_grace, policy=policy)
    except NATS_FAILURES as e:  # a malformed URL; NATS lost past what the service rides out
        return stopped_by(e)


if __name__ == "__main__":
    sys.exit(main())
