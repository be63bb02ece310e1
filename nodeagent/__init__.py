"""nodeagent."""
