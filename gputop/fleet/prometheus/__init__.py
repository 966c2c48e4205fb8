"""The fleet and its jobs read from a Prometheus server (`gputop --prometheus URL`).

``client`` talks to the HTTP API (bounded, authenticated, quoted); ``sources`` says what is read
from gputop's exporter and from dcgm-exporter in a few batched queries; ``diagnose`` runs the
live rules over a dcgm-only node's series; ``jobs`` groups GPUs into jobs across nodes and
sorts them for an operator; ``monitor`` refreshes on its own thread at the scrape interval;
``cli`` is `watch --prometheus` and starts the screen (``gputop.tui.fleet.prom_fleet_app``). Nothing
here imports Textual.
"""
