"""Stage 1 of a trace: reading the file into events (``load``: bounded, validated; the
streaming reader itself is ``gputop.core.trace_stream``, shared with the agent)."""
