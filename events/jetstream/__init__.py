"""NATS and JetStream plumbing (connections, streams, Direct Get, requests, the embedded
server, TLS) and the event store on it.

The package is also the `eventsourcing` persistence module: `PERSISTENCE_MODULE=events.jetstream`
finds its one infrastructure factory here (`events.jetstream.store`)."""

from events.jetstream.store import JetStreamFactory

__all__ = ["JetStreamFactory"]
