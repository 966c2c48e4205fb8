"""Sampling for the exporter, on its own thread: a scrape only reads the families the last
tick published, so it never waits on NVML, psutil or an agent's socket."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gputop.exporter.metrics import FindingClock, all_families


class PublishedFamilies(Collector):
    """A prometheus-client collector that yields whatever was published last."""

    def __init__(self, version: str) -> None:
        self.families: list[Metric] = all_families(None, FindingClock(), version)

    def publish(self, families: list[Metric]) -> None:
        self.families = families  # one reference swap: a scrape sees one tick or the next

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class SamplingThread(threading.Thread):
    """Every ``interval``: sample, run the live rules, count the findings' active time and
    publish the families."""

    def __init__(self, sampler, diagnosis, published: PublishedFamilies, interval: float,
                 version: str, after_publish: Callable[[], None] | None = None) -> None:
        super().__init__(name="exporter-sampler", daemon=True)
        self.sampler = sampler
        self.diagnosis = diagnosis
        self.published = published
        self.interval = interval
        self.version = version
        self.after_publish = after_publish  # the exposition rendered from this tick
        self.clock = FindingClock()
        self.stop_event = threading.Event()
        self.ticks = 0
        self._reported: str | None = None

    def stop(self) -> None:
        self.stop_event.set()

    def tick(self, elapsed: float) -> None:
        started = time.perf_counter()
        snap = self.sampler.sample()
        self.diagnosis.update(snap)
        findings = self.diagnosis.findings()
        self.clock.update(findings, elapsed)
        cost = time.perf_counter() - started
        self.published.publish(all_families(snap, self.clock, self.version, cost))
        if self.after_publish is not None:
            self.after_publish()
        self.ticks += 1

    def run(self) -> None:
        last = time.monotonic()
        next_tick = last
        while not self.stop_event.is_set():
            now = time.monotonic()
            # Active time counts what passed since the last tick, but no more than a few
            # intervals: a machine that was suspended did not watch its findings meanwhile.
            elapsed = min(now - last, 5 * self.interval) if self.ticks else 0.0
            last = now
            try:
                self.tick(elapsed)
            except Exception as exc:  # one line, once per kind; the next tick tries again
                text = f"{type(exc).__name__}: {exc}"
                if text != self._reported:
                    self._reported = text
                    print(f"gputop exporter: sampling failed: {text}", file=sys.stderr,
                          flush=True)
            next_tick = max(next_tick + self.interval, time.monotonic())
            self.stop_event.wait(max(0.0, next_tick - time.monotonic()))
