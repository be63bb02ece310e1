"""events/api."""
