"""`python -m projections run`: the read-model service (`virtbus up` starts it)."""

from __future__ import annotations

import argparse
import sys

from events.connect import add_arguments
from events.logs import configure
from events.subjects import Layout
from projections.service import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m projections")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the read service")
    add_arguments(p)
    args = parser.parse_args(argv)
    configure()
    run(args.nats_url, Layout(args.prefix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
