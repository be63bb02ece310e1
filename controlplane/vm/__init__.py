"""VirtualMachine: its command handlers (`commands`: apply, start / stop / restart by run
strategy, delete) and the VM controller that keeps each VM's VMI in line (`controller`)."""
