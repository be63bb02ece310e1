"""Every NATS name virtbus uses, defined once.

Layout (prefix `p`, upper-cased `P` for stream and bucket names):

| what             | name                                   |
|------------------|----------------------------------------|
| event stream     | `P_EVENTS`, subjects `p.ev.>`          |
| command stream   | `P_COMMANDS`, subjects `p.cmd.>`       |
| node work queue  | `P_NODE`, subjects `p.node.>`          |
| report queue     | `P_REPORTS`, subjects `p.report.>`     |
| serial consoles  | `P_CONSOLE`, subjects `p.console.>`    |
| KV buckets       | `P_HEARTBEATS`, `P_LEASES`, `P_CHECKPOINTS`, `P_OUTCOMES`, `P_APPLIED` |
| object store     | `P_READ_SNAPSHOTS` (read-model snapshots; derived data)                |

Aggregate ids are strings `<kind>.<namespace>.<name>` whose tokens are subject-safe, so an
aggregate's events live on the subject `p.ev.<aggregate id>`; UUID ids (the library's own
test cases) live under `p.ev.uuid.<hex>`.
"""

from __future__ import annotations

import base64
import functools
import re
from typing import Final
from uuid import UUID

import msgspec

from events.api.errors import InvalidSpec
from events.api.names import DNS1123_LABEL

DEFAULT_PREFIX: Final = "virtbus"
CLUSTER_SCOPE: Final = "_"
"""The namespace token of cluster-scoped objects (nodes, the HyperConverged's operands)."""

_PREFIX = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_ENCODED = "="


@functools.lru_cache(maxsize=4096)
def encode_token(value: str) -> str:
    """A subject token for any string: DNS-1123 labels pass through, anything else is encoded
    (remembered: an actor's token is asked for at every one of its commands' outcomes).

    Encoded tokens start with `=`, which no DNS-1123 label can, so the mapping is reversible
    and the result is also a valid KV key.
    """
    if DNS1123_LABEL.fullmatch(value):
        return value
    if not value:
        raise InvalidSpec("name", "must not be empty")
    raw = base64.b32encode(value.encode()).decode().rstrip("=").lower()
    return _ENCODED + raw


@functools.lru_cache(maxsize=4096)
def decode_token(token: str) -> str:
    """A token's text (remembered: every command's subject names its actor's token)."""
    if not token.startswith(_ENCODED):
        return token
    raw = token[1:].upper()
    return base64.b32decode(raw + "=" * (-len(raw) % 8)).decode()


class Layout(msgspec.Struct, frozen=True):
    """The names of one virtbus installation's streams, subjects and buckets."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not _PREFIX.fullmatch(self.prefix):
            raise InvalidSpec(
                "VIRTBUS_PREFIX",
                "must start with a lower-case letter and hold only a-z, 0-9, '_' or '-' "
                "(at most 32 characters)",
            )

    @property
    def upper(self) -> str:
        return self.prefix.upper().replace("-", "_")

    # streams
    @property
    def events_stream(self) -> str:
        return f"{self.upper}_EVENTS"

    @property
    def commands_stream(self) -> str:
        return f"{self.upper}_COMMANDS"

    @property
    def node_stream(self) -> str:
        return f"{self.upper}_NODE"

    @property
    def reports_stream(self) -> str:
        return f"{self.upper}_REPORTS"

    @property
    def console_stream(self) -> str:
        """Real guests' serial console output, as their agents read it (`nodeagent.console`)."""
        return f"{self.upper}_CONSOLE"

    # KV buckets
    @property
    def heartbeats_bucket(self) -> str:
        return f"{self.upper}_HEARTBEATS"

    @property
    def leases_bucket(self) -> str:
        return f"{self.upper}_LEASES"

    @property
    def checkpoints_bucket(self) -> str:
        return f"{self.upper}_CHECKPOINTS"

    @property
    def outcomes_bucket(self) -> str:
        return f"{self.upper}_OUTCOMES"

    @property
    def read_snapshots_bucket(self) -> str:
        """Object store of read-model snapshots (`projections.snapshots`): derived data."""
        return f"{self.upper}_READ_SNAPSHOTS"

    @property
    def read_snapshots_stream(self) -> str:
        """The object store's stream, as JetStream names it."""
        return f"OBJ_{self.read_snapshots_bucket}"

    @property
    def applied_bucket(self) -> str:
        """Node work each agent has applied, under keys `<node>.…` (see `nodeagent.worklog`)."""
        return f"{self.upper}_APPLIED"

    # subjects
    @property
    def tracking_root(self) -> str:
        return f"{self.prefix}.trk"

    def tracking_subject(self, application_name: str) -> str:
        """Process applications' positions, kept in the event stream so they commit atomically
        with the events they caused."""
        return f"{self.tracking_root}.{encode_token(application_name)}"

    @property
    def snapshots_stream(self) -> str:
        return f"{self.upper}_SNAPSHOTS"

    @property
    def snapshots_root(self) -> str:
        return f"{self.prefix}.snap"

    @property
    def events_root(self) -> str:
        return f"{self.prefix}.ev"

    @property
    def dead_letter_stream(self) -> str:
        return f"{self.upper}_DEADLETTERS"

    def dead_letter_subject(self, stream: str) -> str:
        """Where a message of `stream` that can never be handled is kept for operators."""
        return f"{self.prefix}.dead.{encode_token(stream)}"

    @property
    def guard_subject(self) -> str:
        """Where a command's read guards go: empty messages in its atomic batch, each
        expecting an object the decision read (not wrote) to be unchanged. Outside
        `events_root`, so no reader of the log ever sees them."""
        return f"{self.prefix}.guard"

    def events_filter(self, kind: str = "") -> str:
        return f"{self.events_root}.{kind}.>" if kind else f"{self.events_root}.>"

    def aggregate_subject(self, originator_id: UUID | str) -> str:
        return aggregate_subject(self.events_root, originator_id)

    def command_subject(self, actor: str, kind: str, verb: str) -> str:
        return (f"{self.prefix}.cmd.{encode_token(actor)}.{encode_token(kind)}."
                f"{encode_token(verb)}")

    def command_actor(self, subject: str) -> str:
        """The actor a `command_subject` names (the server's permissions vouch for it)."""
        return decode_token(subject.removeprefix(f"{self.prefix}.cmd.").split(".", 1)[0])

    @property
    def commands_filter(self) -> str:
        return f"{self.prefix}.cmd.>"

    def node_subject(self, node: str, verb: str) -> str:
        return f"{self.prefix}.node.{encode_token(node)}.{verb}"

    @property
    def node_work(self) -> str:
        """Every node's work: the node stream's subjects."""
        return f"{self.prefix}.node.>"

    def node_filter(self, node: str) -> str:
        return f"{self.prefix}.node.{encode_token(node)}.>"

    def report_subject(self, node: str, kind: str) -> str:
        return f"{self.prefix}.report.{encode_token(node)}.{kind}"

    def report_node(self, subject: str) -> str:
        """The node a `report_subject` names (the server's permissions vouch for it)."""
        return decode_token(subject.removeprefix(f"{self.prefix}.report.").split(".", 1)[0])

    @property
    def reports_filter(self) -> str:
        return f"{self.prefix}.report.>"

    def console_subject(self, node: str, namespace: str, name: str, uid: str) -> str:
        """One VMI instance's serial console output, as the agent of `node` publishes it: the
        node in the subject lets a node publish only its own guests'
        (`events.authorization.accounts`),
        the uid keeps a VMI's earlier instances apart."""
        return (f"{self.prefix}.console.{encode_token(node)}.{encode_token(namespace)}."
                f"{encode_token(name)}.{encode_token(uid)}")

    def console_filter(self, node: str) -> str:
        """Every console subject of `node`'s guests."""
        return f"{self.prefix}.console.{encode_token(node)}.>"

    def agent_subject(self, node: str, verb: str) -> str:
        """Requests answered by one node's agent directly (simulation), not work items."""
        return f"{self.prefix}.agent.{encode_token(node)}.{verb}"

    @property
    def query_root(self) -> str:
        return f"{self.prefix}.query"


def aggregate_subject(root: str, originator_id: UUID | str) -> str:
    """The subject of an aggregate's events under `root` (`p.ev` or `p.snap`)."""
    if isinstance(originator_id, UUID):
        return f"{root}.uuid.{originator_id.hex}"
    return f"{root}.{originator_id}"


def originator_of(root: str, subject: str) -> UUID | str:
    """The aggregate id whose events live on `subject` (inverse of aggregate_subject)."""
    rest = subject[len(root) + 1 :]
    if rest.startswith("uuid."):
        return UUID(hex=rest[5:])
    return rest


def aggregate_id(kind: str, namespace: str, name: str) -> str:
    """The id (and subject tail) of the aggregate for one object: `<kind>.<namespace>.<name>`."""
    ns = encode_token(namespace) if namespace else CLUSTER_SCOPE
    return f"{kind}.{ns}.{encode_token(name)}"


def split_aggregate_id(agg_id: str) -> tuple[str, str, str]:
    """(kind, namespace, name) of an aggregate id; namespace is '' for cluster scope."""
    kind, namespace, name = agg_id.split(".", 2)
    return kind, "" if namespace == CLUSTER_SCOPE else decode_token(namespace), decode_token(name)
