"""Who may do what: the RBAC policy (`policy`) and the NATS accounts it becomes (`accounts`;
`python -m events.authorization` writes them)."""
