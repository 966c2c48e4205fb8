"""`gputop exporter`: GPUs, host, the training jobs' step telemetry and the live findings as
Prometheus metrics. ``metrics`` builds the metric families (pure), ``sampling`` samples on its
own thread and publishes them, ``server`` serves them over HTTP(S)."""

# Here, not in ``server``: `gputop --help` shows it without importing the HTTP server.
DEFAULT_LISTEN = "127.0.0.1:9835"
