"""`python -m projections run`: the read-model service (`virtbus up` starts it)."""

from __future__ import annotations

import argparse
import os
import sys

from events.api.errors import InvalidSpec
from events.authorization.policy import add_policy_argument, load_policy
from events.jetstream.connect import NATS_FAILURES, access_from_args, add_arguments, stopped_by
from events.language.subjects import Layout
from events.runtime.logs import configure
from projections import ratelimit
from projections.http import StaticTokens
from projections.service import run

TOKEN_FILE_ENV = "VIRTBUS_TOKEN_AUTH_FILE"
TRUST_PROXY_ENV = "VIRTBUS_TRUST_PROXY_HEADERS"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m projections")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the read service")
    add_arguments(p)
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="also serve the HTTP read API and /metrics here (e.g. 0.0.0.0:8080)")
    p.add_argument("--token-auth-file", metavar="FILE", default=os.environ.get(TOKEN_FILE_ENV),
                   help="bearer tokens of the HTTP API: CSV token,user,uid[,\"groups\"] as "
                        "kube-apiserver's (env VIRTBUS_TOKEN_AUTH_FILE); without one, "
                        "every request is system:anonymous")
    p.add_argument("--trust-proxy-headers", action="store_true",
                   default=os.environ.get(TRUST_PROXY_ENV, "") in ("1", "true"),
                   help="take the HTTP asker from X-Remote-User, as kube-rbac-proxy "
                        "(--auth-header-fields-enabled) sets it, on requests from a loopback "
                        f"address: only where the proxy alone reaches it, as a sidecar in "
                        f"the same pod (env {TRUST_PROXY_ENV}=true)")
    add_policy_argument(p)
    ratelimit.add_arguments(p)
    args = parser.parse_args(argv)
    configure()
    try:
        policy = load_policy(args.policy)
        tokens = StaticTokens.load(args.token_auth_file) if args.token_auth_file else None
        audit_limit = ratelimit.limit_from_args(args)
    except InvalidSpec as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    listen = None
    if args.listen:
        host, _, port = args.listen.rpartition(":")
        listen = (host or "0.0.0.0", int(port))
    try:
        run(access_from_args(args), Layout(args.prefix), listen, policy=policy, tokens=tokens,
            audit_limit=audit_limit, trust_proxy_headers=args.trust_proxy_headers)
    except NATS_FAILURES as e:  # a malformed URL; NATS lost past what the service rides out
        return stopped_by(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
