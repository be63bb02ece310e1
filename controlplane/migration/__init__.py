"""VirtualMachineInstanceMigration: its command handlers (`commands`), its controller
(`controller`), the limits in force (`config`); whether a VMI can move is `projections.migratable`.
The phase table is in `commands`; the node work each step makes, in the dispatcher."""
