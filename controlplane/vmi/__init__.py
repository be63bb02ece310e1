"""VirtualMachineInstance: its command handlers (`commands`), from users, controllers and node
reports. No controller of its own: the VM controller creates VMIs, the scheduler places them."""
