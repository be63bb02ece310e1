"""`virtbus`: kubectl/virtctl-shaped commands over the Python client.

Every command that changes something prints its outcome; a refusal exits 1 with the field
and the rule. Reads render KubeVirt's JSON shape (`-o yaml|json`) or a kubectl-like table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import yaml
from nats.errors import NoRespondersError, NoServersError

from controlplane.context import resolve
from controlplane.defaults import FLEET_MIN_NODES, TEST_DRIVER_URI
from controlplane.user.client import Client, CommandRejected
from events.api.manifest import parse_documents
from events.api.node import TaintKey
from events.api.replicaset import DEFAULT_REPLICAS, PRESET, REPLICA_SET
from events.api.resources import quantity
from events.api.scheduling import TAINT_EFFECTS, Taint
from events.connect import (
    NATS_FAILURES,
    NATS_URL_ENV,
    PREFIX_ENV,
    Unreachable,
    describe,
    shown,
)
from events.directget import read_all, sequence
from events.errors import Forbidden, InvalidSpec, NotFound
from events.logs import configure
from events.messages import SimReply, SimRequest
from events.policy import resource_of
from events.subjects import DEFAULT_PREFIX, decode_token
from projections.hco import ALERTS_QUERY, HCO_KINDS, METRICS_QUERY
from projections.instancetype import INSTANCETYPE_KINDS
from projections.query import CLUSTER_SCOPED, resolve_kind

Handler = Callable[[argparse.Namespace, Client], Coroutine[Any, Any, int]]


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


def _age(created: str) -> str:
    if not created:
        return "<unknown>"
    seconds = int((datetime.now(UTC) - datetime.fromisoformat(created)).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _row(kind: str, obj: dict[str, Any]) -> list[str]:
    meta, status = obj["metadata"], obj.get("status", {})
    age = _age(meta.get("creationTimestamp", ""))
    match kind:
        case "VirtualMachine":
            return [meta["name"], age, status.get("printableStatus", ""),
                    str(status.get("ready", False))]
        case "VirtualMachineInstance":
            ready = status.get("phase") == "Running"
            return [meta["name"], age, status.get("phase", ""), status.get("nodeName", ""),
                    str(ready)]
        case "VirtualMachineInstanceMigration":
            state, progress = status.get("migrationState", {}), status.get("progress", {})
            total = progress.get("dataTotalBytes", 0)
            done = f"{100 * progress.get('dataProcessedBytes', 0) // total}%" if total else ""
            return [meta["name"], status.get("phase", ""), obj["spec"].get("vmiName", ""),
                    state.get("sourceNode", ""), state.get("targetNode", ""), done, age]
        case "VirtualMachineInstanceReplicaSet":
            desired = obj["spec"].get("replicas", DEFAULT_REPLICAS)
            return [meta["name"], str(desired), str(status.get("replicas", 0)),
                    str(status.get("readyReplicas", 0)), age]
        case kind if kind in HCO_KINDS or kind in INSTANCETYPE_KINDS or kind == PRESET:
            return [meta["name"], age]
        case _:
            ready = status.get("conditions", [{}])[0].get("status") == "True"
            cordoned = ",SchedulingDisabled" if obj.get("spec", {}).get("unschedulable") else ""
            return [meta["name"], ("Ready" if ready else "NotReady") + cordoned, age]


HEADERS = {
    "VirtualMachine": ["NAME", "AGE", "STATUS", "READY"],
    "VirtualMachineInstance": ["NAME", "AGE", "PHASE", "NODENAME", "READY"],
    "Node": ["NAME", "STATUS", "AGE"],
    "VirtualMachineInstanceMigration": ["NAME", "PHASE", "VMI", "SOURCE", "TARGET", "PROGRESS",
                                        "AGE"],
    "VirtualMachineInstanceReplicaSet": ["NAME", "DESIRED", "CURRENT", "READY", "AGE"],
    **{kind: ["NAME", "AGE"] for kind in (*HCO_KINDS, *INSTANCETYPE_KINDS, PRESET)},
}


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def dump(items: list[dict[str, Any]] | dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(items, indent=2)
    return yaml.safe_dump(items, sort_keys=False).rstrip()


# -- commands ----------------------------------------------------------------------------


async def cmd_apply(args: argparse.Namespace, vb: Client) -> int:
    docs: list[dict[str, Any]] = []
    for source in args.filename:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        docs += parse_documents(text, source)
    for doc in docs:
        doc.setdefault("metadata", {}).setdefault("namespace", args.namespace)
    before = {}
    for doc in docs:
        kind, meta = doc.get("kind", ""), doc.get("metadata", {})
        try:
            await vb.get(kind, scope(kind, meta.get("namespace", "")), meta.get("name", ""))
            before[id(doc)] = True
        except (NotFound, Forbidden, RuntimeError):  # the command's own outcome decides
            before[id(doc)] = False
    outcomes = await vb.apply(*docs)
    for doc, outcome in zip(docs, outcomes, strict=True):
        verb = ("configured" if outcome.sequences else "unchanged") if before[id(doc)] \
            else "created"
        group = str(doc.get("apiVersion", "")).rpartition("/")[0]
        print(f"{str(doc['kind']).lower()}.{group}/{doc['metadata']['name']} {verb}")
    return 0


def scope(kind: str, namespace: str) -> str:
    """The namespace a command looks in: none for a cluster-wide kind (nodes, HCO's)."""
    return "" if kind in CLUSTER_SCOPED else namespace


async def cmd_get(args: argparse.Namespace, vb: Client) -> int:
    kind = resolve_kind(args.kind)
    namespace = "" if args.all_namespaces else scope(kind, args.namespace)
    if args.at is not None:
        items = await vb.query_at(args.at, kind, namespace, args.name or "")
    else:
        items = await vb.query(kind, namespace, args.name or "")
    if args.name and not items:
        where = f" at {args.at}" if args.at is not None else ""
        raise NotFound(f'{kind.lower()} "{args.name}" not found{where}')
    if args.output:
        print(dump(items[0] if args.name else {"apiVersion": "v1", "kind": "List",
                                                "items": items}, args.output))
    elif not items:
        print(f"No resources found in {namespace or 'any'} namespace.")
    else:
        rows = [HEADERS[kind]] + [_row(kind, o) for o in items]
        print(table(rows))
    return 0


def _act(verb: str, message: str) -> Handler:
    async def handler(args: argparse.Namespace, vb: Client) -> int:
        outcome = await vb.act("VirtualMachine", verb, args.namespace, args.name)
        print(message.format(name=args.name, seq=",".join(map(str, outcome.sequences))))
        return 0

    return handler


async def cmd_scale(args: argparse.Namespace, vb: Client) -> int:
    kind = resolve_kind(args.kind)
    if kind != REPLICA_SET:
        raise InvalidSpec("kind", f"only a {REPLICA_SET} scales, not a {kind}")
    await vb.scale(args.namespace, args.name, args.replicas)
    print(f"{kind.lower()}.{resource_of(kind)[0]}/{args.name} scaled")
    return 0


async def cmd_delete(args: argparse.Namespace, vb: Client) -> int:
    kind = resolve_kind(args.kind)
    extra = {} if args.grace_period is None else {"grace_period_seconds": args.grace_period}
    await vb.act(kind, "delete", scope(kind, args.namespace), args.name, **extra)
    group = resource_of(kind)[0]
    print(f'{kind.lower()}{"." if group else ""}{group} "{args.name}" deleted')
    return 0


async def cmd_watch(args: argparse.Namespace, vb: Client) -> int:
    kind = resolve_kind(args.kind)
    namespace = scope(kind, args.namespace)
    async for change in vb.watch(kind, namespace, args.name or "", since=args.since):
        obj = change.object or {}
        if args.output == "json":
            line = {"sequence": change.sequence, "event": change.type,
                    "time": change.time.isoformat(), "actor": change.actor, "object": obj}
            print(json.dumps(line), flush=True)
            continue
        status = obj.get("status", {})
        state = status.get("printableStatus") or status.get("phase") or (
            "deleted" if not obj else "")
        print(f"{change.sequence:>8}  {change.time:%H:%M:%S}  {change.name:<20} "
              f"{change.type:<40} {state}", flush=True)
    return 0


async def cmd_history(args: argparse.Namespace, vb: Client) -> int:
    if args.correlation:
        entries = await vb.correlated(args.correlation)
    elif args.kind and args.name:
        entries = await vb.history(resolve_kind(args.kind), args.namespace, args.name)
    else:
        raise InvalidSpec("history", "needs KIND NAME, or --correlation ID")
    if args.output == "json":
        print(json.dumps(msgspec.to_builtins(entries), indent=2))
        return 0
    if args.correlation:
        rows = [["SEQ", "TIME", "ACTOR", "OBJECT", "EVENT"]]
        rows += [[str(e.sequence), e.time[:19], e.actor, e.object, e.type] for e in entries]
        print(table(rows))
        return 0
    rows = [["SEQ", "TIME", "ACTOR", "EVENT", "COMMAND", "CHANGED"]]
    for e in entries:
        changed = ", ".join(sorted({c["path"] for c in e.changes}))
        rows.append([str(e.sequence), e.time[:19], e.actor, e.type, e.command_id[:8],
                     changed[:80]])
    print(table(rows))
    return 0


async def cmd_patch(args: argparse.Namespace, vb: Client) -> int:
    kind = resolve_kind(args.kind)
    try:
        patch = json.loads(args.patch)
    except json.JSONDecodeError as e:
        raise InvalidSpec("--patch", f"must be JSON: {e.msg}") from None
    if (args.type == "json") != isinstance(patch, list):
        raise InvalidSpec("--patch", "--type=json takes a list of operations, --type=merge "
                                     "an object")
    outcome = await vb.patch(kind, args.namespace, args.name, patch)
    print(f"{kind.lower()}/{args.name} {'patched' if outcome.sequences else 'unchanged'}")
    return 0


async def cmd_annotate(args: argparse.Namespace, vb: Client) -> int:
    """`key=value` sets (with --overwrite if set already), `key-` removes."""
    kind = resolve_kind(args.kind)
    current = (await vb.get(kind, args.namespace, args.name))["metadata"].get("annotations", {})
    changes: dict[str, str | None] = {}
    for item in args.annotations:
        key, sep, value = item.partition("=")
        if sep:
            if key in current and current[key] != value and not args.overwrite:
                raise InvalidSpec(key, "is already set; pass --overwrite to replace it")
            changes[key] = value
        elif key.endswith("-"):
            changes[key[:-1]] = None
        else:
            raise InvalidSpec(item, "must be key=value, or key- to remove")
    await vb.patch(kind, args.namespace, args.name, {"metadata": {"annotations": changes}})
    print(f"{kind.lower()}/{args.name} annotated")
    return 0


def _node_name(args: argparse.Namespace) -> str:
    if resolve_kind(args.kind) != "Node":
        raise InvalidSpec("kind", f"{args.command} works on nodes only")
    return str(args.name)


async def cmd_label(args: argparse.Namespace, vb: Client) -> int:
    """kubectl label node N k=v k2- [--overwrite]."""
    name = _node_name(args)
    labels: dict[str, str] = {}
    remove: list[str] = []
    for item in args.labels:
        key, sep, value = item.partition("=")
        if sep:
            labels[key] = value
        elif key.endswith("-"):
            remove.append(key[:-1])
        else:
            raise InvalidSpec(item, "at least one label update is required: key=value or key-")
    outcome = await vb.label_node(name, labels, remove, overwrite=args.overwrite)
    done = "labeled" if labels else "unlabeled"
    print(f"node/{name} {done if outcome.sequences else 'not labeled'}")
    return 0


def _taint(item: str) -> tuple[Taint | None, TaintKey | None]:
    """kubectl's taint spec: `key[=value]:Effect` adds, `key[:Effect]-` removes."""
    removal = item.endswith("-")
    key_value, sep, effect = (item[:-1] if removal else item).partition(":")
    key, _, value = key_value.partition("=")
    if not key or ((sep or not removal) and effect not in TAINT_EFFECTS):
        raise InvalidSpec(item, "invalid taint spec: key[=value]:Effect with Effect one of "
                                + ", ".join(TAINT_EFFECTS) + ", or key[:Effect]- to remove")
    if removal:
        return None, msgspec.convert({"key": key, "effect": effect or None}, TaintKey)
    return msgspec.convert({"key": key, "value": value, "effect": effect}, Taint), None


async def cmd_taint(args: argparse.Namespace, vb: Client) -> int:
    """kubectl taint node N k=v:Effect k2- [--overwrite]."""
    name = _node_name(args)
    parsed = [_taint(item) for item in args.taints]
    add = [t for t, _ in parsed if t is not None]
    remove = [k for _, k in parsed if k is not None]
    await vb.taint_node(name, add, remove, overwrite=args.overwrite)
    done = ("modified" if args.overwrite else "tainted") if add else "untainted"
    print(f"node/{name} {done}")
    return 0


def _cordon(verb: str) -> Handler:
    async def handler(args: argparse.Namespace, vb: Client) -> int:
        outcome = await vb.act("Node", verb, "", args.name)
        print(f"node/{args.name} {'' if outcome.sequences else 'already '}{verb}ed")
        return 0

    return handler


async def cmd_drain(args: argparse.Namespace, vb: Client) -> int:
    """kubectl drain: cordon and evict; then a line each time what is left changes, until
    the node holds nothing evictable (Ctrl-C stops watching, not the drain)."""
    command = vb.command("Node", "drain", "", args.name)
    await vb.run(command)
    print(f"node/{args.name} cordoned; draining (correlation id {command.id})", flush=True)
    if args.no_wait:
        return 0
    last = ""
    async for progress in vb.drain_progress(args.name):
        line = progress.describe()
        if line != last:
            print(line, flush=True)
            last = line
    print(f"node/{args.name} drained")
    return 0


async def dead_letters(vb: Client) -> list[dict[str, Any]]:
    """What the control plane could never handle, kept with the reason (oldest first)."""
    layout = vb.layout
    msgs = await read_all(vb.nc, layout.dead_letter_stream, f"{layout.prefix}.dead.>")
    return [{"sequence": sequence(m),
             "stream": decode_token((m.headers or {})["Nats-Subject"].rsplit(".", 1)[1]),
             "subject": (m.headers or {}).get("Vb-Subject", ""),
             "streamSequence": (m.headers or {}).get("Vb-Sequence", ""),
             "reason": (m.headers or {}).get("Vb-Reason", ""), "bytes": len(m.data)}
            for m in msgs]


async def cmd_dead_letters(args: argparse.Namespace, vb: Client) -> int:
    letters = await dead_letters(vb)
    if args.output == "json":
        print(json.dumps(letters, indent=2))
        return 0
    if not letters:
        print("No dead letters.")
        return 0
    rows = [["SEQ", "STREAM", "AT", "SUBJECT", "REASON"]]
    for d in letters:
        rows.append([str(d["sequence"]), str(d["stream"]), str(d["streamSequence"]),
                     str(d["subject"])[:40], str(d["reason"])[:80]])
    print(table(rows))
    return 0


async def cmd_metrics(_args: argparse.Namespace, vb: Client) -> int:
    [exposition] = await vb.query(METRICS_QUERY)
    print(exposition["text"], end="")
    return 0


async def cmd_alerts(_args: argparse.Namespace, vb: Client) -> int:
    alerts = await vb.query(ALERTS_QUERY)
    if not alerts:
        print("No alerts firing.")
        return 0
    rows = [["ALERT", "SEVERITY", "LABELS", "SINCE"]]
    for a in alerts:
        labels = ",".join(f"{k}={v}" for k, v in sorted(a["labels"].items()))
        rows.append([a["name"], a["severity"], labels, a["activeSince"]])
    print(table(rows))
    return 0


async def cmd_console(args: argparse.Namespace, vb: Client) -> int:
    """Write the VMI's serial console to stdout as the guest wrote it (bytes, not lines)."""
    out = sys.stdout.buffer
    async for output in vb.console(args.namespace, args.name, follow=args.follow):
        out.write(output)
        out.flush()
    return 0


async def cmd_sim(args: argparse.Namespace, vb: Client) -> int:
    if args.action in ("agent-stop", "agent-start"):
        node, request = args.target, SimRequest(action=args.action)
    else:
        vmi = await vb.get("VirtualMachineInstance", args.namespace, args.target)
        node = vmi.get("status", {}).get("nodeName", "")
        if not node:
            raise InvalidSpec("target", f"VMI {args.target} is not running on any node")
        request = SimRequest(action=args.action, namespace=args.namespace, name=args.target)
    reply = await vb.nc.request(vb.layout.agent_subject(node, "sim"),
                                msgspec.msgpack.encode(request), timeout=30)
    answer = msgspec.msgpack.decode(reply.data, type=SimReply)
    if not answer.ok:
        print(f"error: {answer.error}", file=sys.stderr)
        return 1
    print(f"{args.action}: done on {node}")
    return 0


# -- parser -------------------------------------------------------------------------------


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

    _writers(sub)
    _readers(sub)
    _cluster_configuration(sub)
    _watchers(sub)

    c = sub.add_parser("console", help="a VMI's serial console output (read-only)")
    c.add_argument("name")
    c.add_argument("-f", "--follow", action="store_true",
                   help="go on printing what the guest writes until the VMI is finished")
    _namespace(c)
    c.set_defaults(run=cmd_console)

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
    s.set_defaults(run=cmd_sim)
    unset = dict.fromkeys(("nats_url", "prefix", "actor", "credentials", "ca", "cert", "key"),
                          argparse.SUPPRESS)
    for command in sub.choices.values():
        _connection_options(command, unset)  # given after the command, they win
    return p


Subparsers = Any


def _namespace(q: argparse.ArgumentParser) -> None:
    q.add_argument("-n", "--namespace", default="default")


def _writers(sub: Subparsers) -> None:
    ns = _namespace
    a = sub.add_parser("apply", help="create or update objects from YAML")
    a.add_argument("-f", "--filename", action="append", required=True)
    ns(a)
    a.set_defaults(run=cmd_apply)

    d = sub.add_parser("delete", help="delete an object")
    d.add_argument("kind")
    d.add_argument("name")
    d.add_argument("--grace-period", type=int)
    ns(d)
    d.set_defaults(run=cmd_delete)

    sc = sub.add_parser("scale", help="set a replica set's replicas (kubectl scale vmirs)")
    sc.add_argument("kind")
    sc.add_argument("name")
    sc.add_argument("--replicas", type=int, required=True)
    ns(sc)
    sc.set_defaults(run=cmd_scale)


def _readers(sub: Subparsers) -> None:
    ns = _namespace
    g = sub.add_parser("get", help="show objects")
    g.add_argument("kind")
    g.add_argument("name", nargs="?")
    g.add_argument("-o", "--output", choices=["yaml", "json"])
    g.add_argument("-A", "--all-namespaces", action="store_true")
    g.add_argument("--at", type=_when, help="as of a sequence or a time (point-in-time)")
    ns(g)
    g.set_defaults(run=cmd_get)

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
        s.set_defaults(run=_act(verb, message))


def _cluster_configuration(sub: Subparsers) -> None:
    ns = _namespace
    p = sub.add_parser("patch", help="change an object with a JSON or merge patch")
    p.add_argument("kind")
    p.add_argument("name")
    p.add_argument("--type", choices=["json", "merge"], default="merge")
    p.add_argument("-p", "--patch", required=True)
    ns(p)
    p.set_defaults(run=cmd_patch)

    a = sub.add_parser("annotate", help="set (key=value) or remove (key-) annotations")
    a.add_argument("kind")
    a.add_argument("name")
    a.add_argument("annotations", nargs="+")
    a.add_argument("--overwrite", action="store_true")
    ns(a)
    a.set_defaults(run=cmd_annotate)

    lb = sub.add_parser("label", help="set (key=value) or remove (key-) a node's labels")
    lb.add_argument("kind", help="node")
    lb.add_argument("name")
    lb.add_argument("labels", nargs="+")
    lb.add_argument("--overwrite", action="store_true")
    lb.set_defaults(run=cmd_label)

    tn = sub.add_parser("taint", help="add (key=value:Effect) or remove (key[:Effect]-) a "
                                      "node's taints")
    tn.add_argument("kind", help="node")
    tn.add_argument("name")
    tn.add_argument("taints", nargs="+")
    tn.add_argument("--overwrite", action="store_true")
    tn.set_defaults(run=cmd_taint)

    for verb, help_text in (("cordon", "mark a node unschedulable"),
                            ("uncordon", "mark a node schedulable")):
        c = sub.add_parser(verb, help=help_text)
        c.add_argument("name")
        c.set_defaults(run=_cordon(verb))

    dr = sub.add_parser("drain", help="cordon a node, then evict every VMI by its eviction "
                                      "strategy, showing progress until it is empty")
    dr.add_argument("name")
    dr.add_argument("--no-wait", action="store_true", help="return once the drain is asked")
    dr.set_defaults(run=cmd_drain)

    sub.add_parser("metrics", help="the Prometheus exposition, from the log").set_defaults(
        run=cmd_metrics)
    sub.add_parser("alerts", help="alerts firing now, with labels and since-when").set_defaults(
        run=cmd_alerts)
    dl = sub.add_parser("dead-letters",
                        help="commands and reports that could never be handled, with why")
    dl.add_argument("-o", "--output", choices=["json"])
    dl.set_defaults(run=cmd_dead_letters)


def _watchers(sub: Subparsers) -> None:
    ns = _namespace
    w = sub.add_parser("watch", help="a status stream: from now, or replayed from --since")
    w.add_argument("kind")
    w.add_argument("name", nargs="?")
    w.add_argument("--since", type=_when)
    w.add_argument("-o", "--output", choices=["json"])
    ns(w)
    w.set_defaults(run=cmd_watch)

    h = sub.add_parser("history", help="the audit trail of one object, or of one request "
                                       "across objects (--correlation)")
    h.add_argument("kind", nargs="?")
    h.add_argument("name", nargs="?")
    h.add_argument("--correlation", help="every event this correlation id caused")
    h.add_argument("-o", "--output", choices=["json"])
    ns(h)
    h.set_defaults(run=cmd_history)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure(level="warning" if args.command not in ("up",) else None)
    if args.command == "up":
        from controlplane.up import UpOptions, up  # noqa: PLC0415 (only `up` needs it)

        opts = UpOptions(data_dir=args.data_dir.resolve(), nodes=args.nodes,
                         nats_port=args.nats_port,
                         nats_url=args.nats_url or os.environ.get(NATS_URL_ENV, ""),
                         prefix=args.prefix or os.environ.get(PREFIX_ENV) or DEFAULT_PREFIX,
                         libvirt_uri=args.libvirt_uri,
                         replicas=args.replicas, http_port=args.http_port,
                         secure=args.secure or args.policy is not None, policy=args.policy,
                         fleet=args.fleet, node_cpus=args.node_cpu,
                         node_memory=int(args.node_memory),
                         **({"node_grace_seconds": args.node_grace} if args.node_grace else {}))
        sized = opts.fleet or opts.node_cpus or opts.node_memory
        if opts.node_cpus < 0 or opts.node_memory < 0:
            print("error: --node-cpu and --node-memory must not be negative", file=sys.stderr)
            return 2
        if sized and not opts.uses_fleet:
            print("error: --fleet, --node-cpu and --node-memory simulate nodes in one process: "
                  f"{TEST_DRIVER_URI} only, and not with --secure (a fleet has one NATS "
                  "identity)", file=sys.stderr)
            return 2
        if opts.secure and opts.nats_url:
            print("error: --secure runs its own nats-server; for a server of your own, give "
                  "it `python -m events.authorization`'s accounts and TLS", file=sys.stderr)
            return 2
        try:
            return up(opts)
        except Unreachable as e:
            print(f"error: {e}", file=sys.stderr)
        except NATS_FAILURES as e:  # reached, but its set-up failed (no JetStream, say)
            where = shown(opts.nats_url) if opts.nats_url else "the embedded nats-server"
            print(f"error: NATS at {where}: {describe(e)}", file=sys.stderr)
        return 1
    if args.command == "domxml":
        files = [a for f in args.filename for a in ("-f", f)]
        return subprocess.call([sys.executable, "-m", "nodeagent", "domxml", *files,
                                "--domain-type", args.domain_type])
    if args.command == "node":
        store = ["--image-dir", args.image_dir] if args.image_dir else []
        return subprocess.call([sys.executable, "-m", "nodeagent", "import-image",
                                args.reference, args.file, "--path", args.path, *store])
    ctx = resolve(args.nats_url, args.prefix, credentials=args.credentials, ca=args.ca,
                  cert=args.cert, key=args.key)

    async def go() -> int:
        vb = await Client.connect(ctx.access, ctx.prefix, args.actor)
        try:
            code: int = await args.run(args, vb)
            return code
        finally:
            await vb.close()

    try:
        return asyncio.run(go())
    except InvalidSpec as e:
        print(f"error: {e.field}: {e.rule}", file=sys.stderr)
    except CommandRejected as e:
        print(f"error: {e}", file=sys.stderr)
    except (NotFound, Forbidden) as e:
        print(f"error: {e}", file=sys.stderr)
    except Unreachable as e:  # before OSError, its base
        print(f"error: {e}", file=sys.stderr)
    except NoRespondersError:
        print("error: the read service is not answering; is `virtbus up` running?",
              file=sys.stderr)
    except (OSError, TimeoutError, NoServersError) as e:
        print(f"error: cannot reach virtbus at {shown(ctx.nats_url)}: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
