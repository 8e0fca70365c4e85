"""The run directory: its files, the contract of every line in them, reading and checking them.

``run`` writes a run directory; ``export``, ``report`` and the read-only commands (``status``,
``verify``) read it through this package, and nothing here imports the write path."""
