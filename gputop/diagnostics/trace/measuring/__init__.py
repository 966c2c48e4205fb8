"""Stage 2 of a trace: measuring. Steps, the device's busy and idle time by role, gap
attribution, host threads, kernels, copies and links; ``metrics.compute_metrics`` assembles
them into a ``TraceMetrics`` (``trace_metrics``), which the causes and the report read."""
