"""The Backend protocol: what the core asks of a world (an executor and a transfer engine)."""
