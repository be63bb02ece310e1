"""Instancetypes and preferences: their commands, the expansion of a VM with them, and the
revisions that pin a VM to what it first started with."""
