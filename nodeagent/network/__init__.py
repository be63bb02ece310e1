"""Networking for real guests: the node's bridge, taps, DHCP and NAT (`nodeagent.network.node`)."""
