"""Messages that are not events: commands in, outcomes out, node work and node reports.

| message      | stream / bucket  | writer           | reader            |
|--------------|------------------|------------------|-------------------|
| Command      | `P_COMMANDS`     | clients          | control plane     |
| Outcome      | `P_OUTCOMES` KV  | control plane    | the client waiting|
| NodeCommand  | `P_NODE`         | dispatcher       | that node's agent |
| NodeReport   | `P_REPORTS`      | node agents      | control plane     |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec

from events.api.errors import InvalidSpec
from events.api.names import NODE_ACTOR_PREFIX
from events.api.vm import VirtualMachineInstanceNetworkInterface
from events.language.codec import Event, event_type
from events.language.subjects import aggregate_id, encode_token

COMMAND_KIND: Final = "command"
M = TypeVar("M", bound=msgspec.Struct)

Verb = Literal["apply", "start", "stop", "restart", "delete", "pause", "unpause", "soft-reboot",
               "patch"]


class Command(msgspec.Struct, frozen=True, kw_only=True):
    """A request to change something; idempotent by `id`."""

    id: str
    actor: str
    kind: str
    verb: str
    namespace: str = ""
    name: str = ""
    manifest: dict[str, Any] | None = None
    """The whole object, for `apply`."""
    correlation_id: str = ""
    grace_period_seconds: int | None = None


MAX_NAME_LENGTH: Final = 253
"""An object's name (a DNS-1123 subdomain at most, as Kubernetes names are)."""
MAX_TOKEN_LENGTH: Final = 63
"""A kind, a verb, a namespace: DNS-1123 labels at most."""
MAX_ID_LENGTH: Final = 200
"""A command's id and correlation id, and an actor."""

def outcome_key(actor: str, command_id: str) -> str:
    """A command's key in the outcomes bucket: under its actor, so each user may be allowed
    to read and watch its own outcomes only (`$KV.<P>_OUTCOMES.<actor>.>`)."""
    return f"{encode_token(actor)}.{encode_token(command_id)}"


def node_actor(node: str) -> str:
    """`system:node:<node>`: who speaks in a command made from that node's report, and who
    asks when its agent queries the read service (the subject vouches for the node)."""
    return f"{NODE_ACTOR_PREFIX}{node}"


def check_envelope(command: Command) -> None:
    """What of a command becomes subjects, headers and markers is bounded, so that no
    command can make the log refuse the record of its own outcome."""
    for field, value, limit in (
        ("id", command.id, MAX_ID_LENGTH),
        ("kind", command.kind, MAX_TOKEN_LENGTH),
        ("verb", command.verb, MAX_TOKEN_LENGTH),
        ("metadata.namespace", command.namespace, MAX_TOKEN_LENGTH),
        ("metadata.name", command.name, MAX_NAME_LENGTH),
        ("actor", command.actor, MAX_ID_LENGTH),
        ("correlationId", command.correlation_id, MAX_ID_LENGTH),
    ):
        if len(value) > limit:
            raise InvalidSpec(field, f"must be at most {limit} characters")
    for field, value in (("id", command.id), ("kind", command.kind), ("verb", command.verb)):
        if not value:
            raise InvalidSpec(field, "must not be empty")


def _no_extensions(code: int, data: memoryview) -> Any:
    raise msgspec.ValidationError(f"msgpack extension type {code} is not allowed")


def message_decoder(cls: type[M]) -> Callable[[bytes], M]:
    """A strict decoder for what arrives over the wire: JSON-like data only (a msgpack
    extension would pass into free-form fields and break every reader after it)."""
    decoder = msgspec.msgpack.Decoder(cls, ext_hook=_no_extensions)

    def decode(data: bytes) -> M:
        try:
            return decoder.decode(data)
        except msgspec.DecodeError:
            raise
        except (UnicodeDecodeError, RecursionError, ValueError) as e:  # not UTF-8, too deep
            raise msgspec.DecodeError(f"{type(e).__name__}: {e}") from None

    return decode


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """Exactly one per command: accepted with the sequences of its events, or rejected."""

    command_id: str
    accepted: bool
    sequences: list[int] = []
    reason: str = ""
    field: str = ""


@event_type("CommandAccepted")
class CommandAccepted(Event, frozen=True, kw_only=True):
    """A command's outcome, appended in the same atomic batch as its events, or right after
    its one event (stored alone). Its aggregate, `command._.<id>`, may exist once: what makes
    every command's first outcome final."""

    command_id: str
    kind: str
    verb: str
    target: str
    event_count: int = 0
    """How many events the command caused: the command's outcome, re-readable. 0 is an
    accepted no-op."""
    sequences: list[int] = []
    """Where its events are, when they were stored before the marker (each alone, marked
    `marker_follows`); empty when they follow it in its atomic batch."""


@event_type("CommandRejected")
class CommandRejected(Event, frozen=True, kw_only=True):
    """A command's outcome when it was refused: on the same once-only aggregate as
    `CommandAccepted`, so a later delivery of the command answers this, never decides again."""

    command_id: str
    kind: str
    verb: str
    target: str
    reason: str
    field: str = ""


def marker_aggregate(command_id: str) -> str:
    """The aggregate of a command's outcome marker, `command._.<id>`: it may exist once."""
    return aggregate_id(COMMAND_KIND, "", command_id)


def recorded_outcome(marker: Event, sequence: int) -> Outcome | None:
    """The outcome a command's marker (stored at `sequence`) records; None for an event that
    is not a well-formed marker (another type, or not on its own command's aggregate). An
    accepted marker names its events' sequences when they were stored before it; otherwise
    it leads its atomic batch, whose events are stored contiguously, so the command's events
    are the `event_count` sequences right after it."""
    match marker:
        case CommandAccepted(command_id=command_id) | CommandRejected(command_id=command_id) \
                if marker.originator_id != marker_aggregate(command_id):
            return None
        case CommandAccepted(command_id=command_id, sequences=sequences) if sequences:
            return Outcome(command_id=command_id, accepted=True, sequences=list(sequences))
        case CommandAccepted(command_id=command_id, event_count=count):
            return Outcome(command_id=command_id, accepted=True,
                           sequences=list(range(sequence + 1, sequence + 1 + count)))
        case CommandRejected(command_id=command_id, reason=reason, field=field):
            return Outcome(command_id=command_id, accepted=False, reason=reason, field=field)
        case _:
            return None


NodeVerb = Literal["launch", "stop", "pause", "unpause", "restart", "migrate-prepare",
                   "migrate", "migrate-abort", "migrate-finish", "migrate-cleanup"]
"""The migration verbs, in a migration's order (see `MigrationOrder`):

| verb            | node   | dispatched on                 | the agent                           |
|-----------------|--------|-------------------------------|-------------------------------------|
| migrate-prepare | target | the target chosen (Scheduled) | checks it can take the guest, keeps |
|                 |        |                               | the order, reports `target-ready`   |
|                 |        |                               | (and where it listens, on a real    |
|                 |        |                               | host: `target_address`)             |
| migrate         | source | TargetReady (the order has    | transfers memory, reports `running`,|
|                 |        | the target's address)         | `progress`, then `converged` (the   |
|                 |        |                               | simulated guest still runs here; a  |
|                 |        |                               | real one runs on the target) or     |
|                 |        |                               | `failed` (it runs here)             |
| migrate-abort   | source | the migration Failed          | stops the transfer; the guest stays |
| migrate-finish  | target | Succeeded (nodeName = target) | starts (or adopts) the guest here   |
| migrate-cleanup | source | Succeeded                     | removes its copy, reporting nothing |
|                 | target | Failed                        | forgets the order                   |

The log decides: the guest moves only when the control plane appends Succeeded, and each
side's work after that is idempotent, so a crash anywhere leaves it in one place."""


SIMULATED_DIRTY_RATE_ANNOTATION: Final = "virtbus.io/simulated-dirty-rate"
"""On the test driver only: how fast the guest dirties memory during a simulated
migration (a quantity per second, e.g. `64Mi`); absent: the agent's default."""


MigrationAddress = Annotated[str, msgspec.Meta(
    max_length=253,
    pattern=r"^$|^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$|^[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*$")]
"""Where a target listens for a migration (KubeVirt's `migrationState.targetNodeAddress`): a
host name, an IPv4 or an IPv6 address; '' when it did not say. Checked when a message is
decoded, as it becomes part of the URIs a source's libvirt connects to."""


class MigrationOrder(msgspec.Struct, frozen=True, kw_only=True):
    """One migration as both of its agents need it; limits from the effective KubeVirt
    configuration when the target was chosen (`0` bandwidth: unlimited)."""

    uid: str
    """The VirtualMachineInstanceMigration's uid: reports name it."""
    name: str
    source_node: str
    target_node: str
    bandwidth_bytes_per_second: int = 0
    progress_timeout_seconds: int = 150
    completion_timeout_seconds: int = 0
    """completionTimeoutPerGiB times the guest's memory in GiB; 0: none."""
    allow_post_copy: bool = False
    allow_auto_converge: bool = False
    target_address: MigrationAddress = ""
    """Where the target listens, as its agent reported it ready: set on `migrate`."""


class NodeCommand(msgspec.Struct, frozen=True, kw_only=True):
    """Work for one node's agent, dispatched from an event (its id dedupes the dispatch)."""

    event_id: str
    verb: NodeVerb
    namespace: str
    name: str
    uid: str
    vmi: dict[str, Any] | None = None
    """The VMI (apiVersion/kind/metadata/spec) to launch, in KubeVirt's JSON shape."""
    grace_period_seconds: int = 0
    migration: MigrationOrder | None = None
    """For the migration verbs."""
    command_id: str = ""
    """The command that caused the event, and the request it belongs to: for the logs."""
    correlation_id: str = ""


ReportKind = Literal["node", "domain", "migration", "interfaces"]


class DomainObservation(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent saw of one guest. `phase` is already mapped as virt-handler maps it."""

    namespace: str
    name: str
    uid: str
    phase: str
    reason: str = ""
    gone: bool = False
    """The domain no longer exists on the host."""
    paused: bool = False
    """The guest's vCPUs are suspended; its phase stays Running, as in KubeVirt."""
    paused_reason: str = ""
    """Why, when the hypervisor paused it (`PausedIOError`); '' for a user's pause."""
    agent_connected: bool | None = None
    """The QEMU guest agent's channel is connected (libvirt's agent lifecycle event), where
    the report says; None: this report does not say."""


class InterfacesObservation(msgspec.Struct, frozen=True, kw_only=True):
    """A guest's network interfaces as its node knows them now (name and MAC from the domain,
    the address from the node's DHCP lease): the whole list, each time it changes."""

    namespace: str
    name: str
    uid: str
    interfaces: list[VirtualMachineInstanceNetworkInterface]


MigrationState = Literal["target-ready", "running", "progress", "converged", "failed"]
MigrationMode = Literal["PreCopy", "PostCopy"]


class MigrationObservation(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent saw of one migration: the target is ready, or the source's transfer
    (its progress in bytes, converged: ready to switch over, failed: why)."""

    namespace: str
    name: str
    """The VMI's."""
    vmi_uid: str
    migration_uid: str
    state: MigrationState
    mode: MigrationMode = "PreCopy"
    data_total: int = 0
    data_processed: int = 0
    data_remaining: int = 0
    reason: str = ""
    target_address: MigrationAddress = ""
    """With `target-ready` on a real hypervisor: where the source is to send the guest."""


class NodeReport(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    node: str
    kind: ReportKind
    info: dict[str, Any] | None = None
    domain: DomainObservation | None = None
    migration: MigrationObservation | None = None
    interfaces: InterfacesObservation | None = None
    correlation_id: str = ""
    """The request whose node work this report answers ("" for what the host did alone)."""


SimAction = Literal["guest-shutdown", "guest-crash", "guest-io-error", "agent-stop",
                    "agent-start", "domains"]


class SimRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Something that happens to a simulated (test-driver) host, asked of its agent."""

    action: SimAction
    namespace: str = ""
    name: str = ""


class DomainSummary(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    uid: str
    state: int


class SimReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    error: str = ""
    domains: list[DomainSummary] = []
    """For `domains`: every guest of this host that belongs to a VMI."""
