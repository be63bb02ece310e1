"""Any declared kind with no handlers of its own: its objects are kept as applied."""
