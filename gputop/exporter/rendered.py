"""The exposition rendered once per tick, served as bytes.

Rendering a scrape (walking every family and formatting every sample) costs milliseconds of
Python for each scrape; with many scrapers at once they queue behind each other for the
interpreter. So the sampling thread renders the exposition after each tick, in each format
(text or OpenMetrics, plain or gzip) a scraper asked for since, and a scrape only picks the
bytes up: one reference read, no lock, whatever the other clients do. A format asked for the
first time is rendered by that scrape and kept for the following ticks (at most
``MAX_FORMATS`` of them: the ``Accept`` header's variants are few, a client's are not ours to
multiply).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

MAX_FORMATS = 8
GZIP_LEVEL = 6

Key = tuple[str, bool]  # (content type, gzip)


class RenderedExposition:
    """The newest tick's exposition bytes per format; ``refresh`` after each tick."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._encoders: dict[Key, Callable[[CollectorRegistry], bytes]] = {}
        self._bodies: dict[Key, bytes] = {}
        for accept in ("", "application/openmetrics-text; version=1.0.0"):
            encoder, content_type = choose_encoder(accept)  # what Prometheus and curl ask for
            self._encoders[(content_type, False)] = encoder

    def _render(self, key: Key) -> bytes:
        output = self._encoders[key](self.registry)
        return gzip.compress(output, GZIP_LEVEL) if key[1] else output

    def refresh(self) -> None:
        """Render every format asked for so far from what the registry holds now (the sampling
        thread, after it published a tick); one reference swap publishes them all."""
        self._bodies = {key: self._render(key) for key in list(self._encoders)}

    def body(self, accept: str | None, gzipped: bool, render: bool = True,
             ) -> tuple[str, bytes | None]:
        """The content type and bytes for a scrape's ``Accept`` header; with ``render`` False,
        None for bytes not rendered yet (the caller renders them elsewhere)."""
        encoder, content_type = choose_encoder(accept or "")
        key = (content_type, gzipped)
        bodies = self._bodies  # one read: this tick's bytes or the next's, never a mix
        found = bodies.get(key)
        if found is not None or not render:
            return content_type, found
        if key not in self._encoders and len(self._encoders) < MAX_FORMATS:
            self._encoders[key] = encoder  # rendered from the next tick on
        output = encoder(self.registry)
        return content_type, gzip.compress(output, GZIP_LEVEL) if gzipped else output
