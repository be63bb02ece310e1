"""VirtualMachineInstanceMigration: its command handlers (`commands`) and its controller
(`controller`); the limits in force are the cluster's (`controlplane.clusterconfig`); whether a
VMI can move is `projections.migratable`.
The phase table is in `commands`; the node work each step makes, in the dispatcher."""
