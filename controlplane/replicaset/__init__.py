"""VirtualMachineInstanceReplicaSet: its command handlers (`commands`: apply, delete, scale,
and the controller's replica creations and deletions, each checked against the log) and its
controller (`controller`), which keeps the count of VMIs at `spec.replicas`."""
