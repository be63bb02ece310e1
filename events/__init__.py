"""The ground every virtbus process stands on, in four floors (lowest first):

- `events.api`: the Kubernetes-shaped API schemas, their admission, and the errors bad input
  is refused with;
- `events.language`: the log's language: event and command types, each kind's events
  (`events.language.kinds`), the codec and its upcasters, subject names;
- `events.jetstream`: NATS and JetStream plumbing, and the event store on it (the
  `eventsourcing` persistence module `events.jetstream`);
- `events.authorization`: who may do what: the RBAC policy and NATS accounts;

beside `events.runtime`, what every process runs with (logging, asyncio helpers, the garbage
collector's settings). import-linter keeps the direction (pyproject.toml).
"""
