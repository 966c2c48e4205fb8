"""Many nodes from one terminal, over the user's own OpenSSH.

Each node runs `gputop stream` (JSON lines on its stdout, see ``wire``); this package starts
those streams with plain ``ssh`` subprocesses (``ssh``), reads and validates them on one I/O
thread (``monitor``), asks a node for a capture (``capture``) and prints the findings of every
node for scripts (``watch``). Nothing here imports Textual: the fleet screen is in
``gputop.tui.fleet.fleet_app``.
"""
