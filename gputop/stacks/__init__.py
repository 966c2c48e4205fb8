"""Python stacks of any process, read from outside with py-spy: no code runs in the target.

* ``access``: may this process read that one's memory (ptrace rules), and if not, one line
  that says why and what would allow it;
* ``pyspy``: runs the py-spy binary (``record`` and ``dump``), bounded in time and output;
* ``profile``: parses what py-spy wrote into a ``StackReport`` (pure, no I/O);
* ``render``: the report as text (``gputop stacks`` and the TUI's stacks view);
* ``where``: the "where" line of live findings, sampled off the UI thread.

Blocking calls live here, like ``gputop/collect/``: never import textual.
"""
