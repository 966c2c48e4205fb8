"""Record, report and replay: a run's snapshots in a file (``store``), read back for ``gputop report``
(``summary``) and played in the monitor (``replay``)."""
