"""`virtbus`: kubectl/virtctl-shaped commands over the Python client.

This module only parses, so that `virtbus --help` and a mistyped command answer at once: what
a command does, with the client and nats it needs, is `controlplane.user.actions`, imported
when one runs. Each parsed command names its handler there (`run`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controlplane.defaults import FLEET_MIN_NODES, TEST_DRIVER_URI
from events.api.resources import quantity


def _when(text: str) -> int | datetime:
    """A sequence number, or an ISO-8601 time (UTC when no zone is given)."""
    if text.isdigit():
        return int(text)
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a sequence nor an ISO time") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _connection_options(p: argparse.ArgumentParser, defaults: Mapping[str, object]) -> None:
    """`--nats-url`, `--prefix`, `--as`: before the command or after it, as with kubectl."""
    p.add_argument("--nats-url", default=defaults["nats_url"],
                   help="NATS server(s); default: $VIRTBUS_NATS_URL or context")
    p.add_argument("--prefix", default=defaults["prefix"],
                   help="installation prefix; default: $VIRTBUS_PREFIX or virtbus")
    p.add_argument("--as", dest="actor", default=defaults["actor"],
                   help="actor recorded on the events")
    for flag, dest, about in CREDENTIAL_FLAGS:
        p.add_argument(flag, dest=dest, default=defaults[dest], help=about)


CREDENTIAL_FLAGS = (
    ("--nats-credentials", "credentials", 'JSON {"user", "password"} file, mode 0600; '
                                          "default: $VIRTBUS_NATS_CREDENTIALS or context"),
    ("--nats-ca", "ca", "CA that verifies the server (TLS); default: $VIRTBUS_NATS_CA or "
                        "context"),
    ("--nats-cert", "cert", "client certificate (mutual TLS)"),
    ("--nats-key", "key", "its private key, mode 0600"),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="virtbus", description=__doc__.splitlines()[0])
    _connection_options(p, {"nats_url": None, "prefix": None, "actor": "", "credentials": None,
                            "ca": None, "cert": None, "key": None})
    sub = p.add_subparsers(dest="command", required=True)

    _up(sub)
    _writers(sub)
    _readers(sub)
    _cluster_configuration(sub)
    _watchers(sub)

    c = sub.add_parser("console", help="a VMI's serial console output (read-only)")
    c.add_argument("name")
    c.add_argument("-f", "--follow", action="store_true",
                   help="go on printing what the guest writes until the VMI is finished")
    _namespace(c)
    c.set_defaults(run="console")

    _local(sub)
    unset = dict.fromkeys(("nats_url", "prefix", "actor", "credentials", "ca", "cert", "key"),
                          argparse.SUPPRESS)
    for command in sub.choices.values():
        _connection_options(command, unset)  # given after the command, they win
    return p

Subparsers = Any


def _namespace(q: argparse.ArgumentParser) -> None:
    q.add_argument("-n", "--namespace", default="default")


def _up(sub: Subparsers) -> None:
    """`virtbus up` and its options."""
    u = sub.add_parser("up", help="run everything on this machine")
    u.add_argument("--data-dir", type=Path, default=Path(".virtbus"))
    u.add_argument("--nodes", type=int, default=2)
    u.add_argument("--nats-port", type=int, default=0)
    u.add_argument("--libvirt-uri", default=TEST_DRIVER_URI,
                   help=f"the agents' libvirt; on {TEST_DRIVER_URI} each simulated host is kept "
                        "in DATA_DIR/hosts/NODE.xml")
    u.add_argument("--replicas", type=int, default=1)
    u.add_argument("--node-grace", type=float, default=None)
    u.add_argument("--http-port", type=int, default=0,
                   help="port of the HTTP read API on 127.0.0.1 (default: a free one)")
    u.add_argument("--secure", action="store_true",
                   help="TLS, one NATS identity per process and person, the RBAC policy "
                        "enforced; material kept in DATA_DIR/secure")
    u.add_argument("--policy", type=Path, default=None,
                   help="with --secure: the RBAC policy (default: operator is cluster-admin)")
    u.add_argument("--fleet", action="store_true",
                   help=f"simulated nodes in one process (the default from {FLEET_MIN_NODES} "
                        "nodes on)")
    u.add_argument("--node-cpu", type=int, default=0,
                   help="CPUs of each simulated node (a fleet; default: the test driver's 16)")
    u.add_argument("--node-memory", type=quantity, default=0, metavar="QUANTITY",
                   help="memory of each simulated node (a fleet; default: the test driver's "
                        "3Gi)")


def _local(sub: Subparsers) -> None:
    """What acts on this host or a simulated one: `domxml`, `node`, `sim`."""
    x = sub.add_parser("domxml", help="print the libvirt domain XML of a VM/VMI manifest")
    x.add_argument("-f", "--filename", action="append", required=True)
    x.add_argument("--domain-type", default="kvm", choices=["kvm", "qemu", "test"])

    n = sub.add_parser("node", help="this host's node: its image store")
    node_sub = n.add_subparsers(dest="node_command", required=True)
    ii = node_sub.add_parser("import-image", help="put FILE into image REFERENCE in this "
                                                  "host's image store (python -m nodeagent)")
    ii.add_argument("reference")
    ii.add_argument("file")
    ii.add_argument("--path", default="", help="where in the image (default /disk/<name>)")
    ii.add_argument("--image-dir", default="", help="the node's image store (the agent's "
                                                    "--image-dir; default its default)")

    s = sub.add_parser("sim", help="make things happen to a simulated (test-driver) host")
    s.add_argument("action", choices=["guest-shutdown", "guest-crash", "guest-io-error",
                                      "agent-stop", "agent-start"])
    s.add_argument("target", help="the VMI (guest-*) or the node (agent-*)")
    _namespace(s)
    s.set_defaults(run="sim")



def _writers(sub: Subparsers) -> None:
    ns = _namespace
    a = sub.add_parser("apply", help="create or update objects from YAML")
    a.add_argument("-f", "--filename", action="append", required=True)
    ns(a)
    a.set_defaults(run="apply")

    d = sub.add_parser("delete", help="delete an object")
    d.add_argument("kind")
    d.add_argument("name")
    d.add_argument("--grace-period", type=int)
    ns(d)
    d.set_defaults(run="delete")

    sc = sub.add_parser("scale", help="set a replica set's replicas (kubectl scale vmirs)")
    sc.add_argument("kind")
    sc.add_argument("name")
    sc.add_argument("--replicas", type=int, required=True)
    ns(sc)
    sc.set_defaults(run="scale")


def _readers(sub: Subparsers) -> None:
    ns = _namespace
    g = sub.add_parser("get", help="show objects")
    g.add_argument("kind")
    g.add_argument("name", nargs="?")
    g.add_argument("-o", "--output", choices=["yaml", "json"])
    g.add_argument("-A", "--all-namespaces", action="store_true")
    g.add_argument("--at", type=_when, help="as of a sequence or a time (point-in-time)")
    ns(g)
    g.set_defaults(run="get")

    for verb, message in (("start", "VM {name} was scheduled to start"),
                          ("stop", "VM {name} was scheduled to stop"),
                          ("restart", "VM {name} was scheduled to restart"),
                          ("pause", "VMI {name} was scheduled to pause"),
                          ("unpause", "VMI {name} was scheduled to unpause"),
                          ("soft-reboot", "VMI {name} was scheduled to soft reboot"),
                          ("migrate", "VM {name} was scheduled to migrate"),
                          ("migrate-cancel", "VM {name} was scheduled to migrate-cancel")):
        s = sub.add_parser(verb, help=f"{verb} a VirtualMachine")
        s.add_argument("name")
        ns(s)
        s.set_defaults(run="act", message=message)


def _cluster_configuration(sub: Subparsers) -> None:
    ns = _namespace
    p = sub.add_parser("patch", help="change an object with a JSON or merge patch")
    p.add_argument("kind")
    p.add_argument("name")
    p.add_argument("--type", choices=["json", "merge"], default="merge")
    p.add_argument("-p", "--patch", required=True)
    ns(p)
    p.set_defaults(run="patch")

    a = sub.add_parser("annotate", help="set (key=value) or remove (key-) annotations")
    a.add_argument("kind")
    a.add_argument("name")
    a.add_argument("annotations", nargs="+")
    a.add_argument("--overwrite", action="store_true")
    ns(a)
    a.set_defaults(run="annotate")

    lb = sub.add_parser("label", help="set (key=value) or remove (key-) a node's labels")
    lb.add_argument("kind", help="node")
    lb.add_argument("name")
    lb.add_argument("labels", nargs="+")
    lb.add_argument("--overwrite", action="store_true")
    lb.set_defaults(run="label")

    tn = sub.add_parser("taint", help="add (key=value:Effect) or remove (key[:Effect]-) a "
                                      "node's taints")
    tn.add_argument("kind", help="node")
    tn.add_argument("name")
    tn.add_argument("taints", nargs="+")
    tn.add_argument("--overwrite", action="store_true")
    tn.set_defaults(run="taint")

    for verb, help_text in (("cordon", "mark a node unschedulable"),
                            ("uncordon", "mark a node schedulable")):
        c = sub.add_parser(verb, help=help_text)
        c.add_argument("name")
        c.set_defaults(run="cordon")

    dr = sub.add_parser("drain", help="cordon a node, then evict every VMI by its eviction "
                                      "strategy, showing progress until it is empty")
    dr.add_argument("name")
    dr.add_argument("--no-wait", action="store_true", help="return once the drain is asked")
    dr.set_defaults(run="drain")

    sub.add_parser("metrics", help="the Prometheus exposition, from the log").set_defaults(
        run="metrics")
    sub.add_parser("alerts", help="alerts firing now, with labels and since-when").set_defaults(
        run="alerts")
    dl = sub.add_parser("dead-letters",
                        help="commands and reports that could never be handled, with why")
    dl.add_argument("-o", "--output", choices=["json"])
    dl.set_defaults(run="dead-letters")


def _watchers(sub: Subparsers) -> None:
    ns = _namespace
    w = sub.add_parser("watch", help="a status stream: from now, or replayed from --since")
    w.add_argument("kind")
    w.add_argument("name", nargs="?")
    w.add_argument("--since", type=_when)
    w.add_argument("-o", "--output", choices=["json"])
    ns(w)
    w.set_defaults(run="watch")

    h = sub.add_parser("history", help="the audit trail of one object, or of one request "
                                       "across objects (--correlation)")
    h.add_argument("kind", nargs="?")
    h.add_argument("name", nargs="?")
    h.add_argument("--correlation", help="every event this correlation id caused")
    h.add_argument("-o", "--output", choices=["json"])
    ns(h)
    h.set_defaults(run="history")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "domxml":
        files = [a for f in args.filename for a in ("-f", f)]
        return subprocess.call([sys.executable, "-m", "nodeagent", "domxml", *files,
                                "--domain-type", args.domain_type])
    if args.command == "node":
        store = ["--image-dir", args.image_dir] if args.image_dir else []
        return subprocess.call([sys.executable, "-m", "nodeagent", "import-image",
                                args.reference, args.file, "--path", args.path, *store])
    from controlplane.user.actions import run  # noqa: PLC0415 (parsing does not need it)

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
