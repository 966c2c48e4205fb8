"""Start sampling before the monitor's user interface is imported.

Importing Textual and building the app takes a few tenths of a second, and so do opening the
driver (and, for a demo, starting its stand-in processes) and the first sample. `gputop top`
starts this thread first, so both happen at once; the app then hands it its feed and the
thread goes on as the sampling thread. It stays the thread that started the demo's
processes for as long as they run (they are bound to it with PR_SET_PDEATHSIG).

No Textual here: importing this module must stay cheap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class EarlySampler:
    def __init__(self, demo: str | None, gpus: list[int] | None, seed: int,
                 on_first: Callable[[object], None] | None = None) -> None:
        """``on_first``: called on this thread with the first sample (the plain first frame,
        plain_frame.py), before the app is attached."""
        self.demo, self.gpus, self.seed = demo, gpus, seed
        self._on_first = on_first
        self.first = None  # the first sample, once taken (the app draws it at mount)
        self.first_taken = threading.Event()  # set also when opening the driver failed
        self._attached = threading.Event()
        self._feed = None
        self._failed: Callable[[str], None] | None = None
        self._noted: Callable[[str], None] | None = None
        self._notes: list[str] = []  # stand-in failures told before the app was attached
        self._notes_lock = threading.Lock()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="gputop-sampler", daemon=True)

    def start(self) -> EarlySampler:
        self.thread.start()
        return self

    def attach(self, feed, failed: Callable[[str], None],
               noted: Callable[[str], None] | None = None) -> None:
        """Hand over the app's feed (a SamplerFeed), how to report a failure and how to tell
        that a stand-in of the demo ended."""
        self._feed, self._failed = feed, failed
        with self._notes_lock:
            self._noted, notes, self._notes = noted, self._notes, []
        for line in notes if noted is not None else ():
            noted(line)
        self._attached.set()
        if self.error is not None:
            failed(self.error)

    def _note(self, line: str) -> None:
        with self._notes_lock:
            if self._noted is None:
                self._notes.append(line)
                return
        self._noted(line)

    def stop(self, timeout: float = 5.0) -> None:
        """When the app has ended: stop sampling and wait for the demo to be cleaned up."""
        if self._feed is not None:
            self._feed.stop()
        self._attached.set()
        self.thread.join(timeout)

    def _run(self) -> None:
        from gputop.client.session import open_sampler

        try:
            # No wait for the demo's workers: the first frame comes first, and they show
            # as they are forked.
            with open_sampler(self.demo, self.gpus, self.seed, wait_for_workers=0,
                              on_standin_failure=self._note) as sampler:
                # Held in a list that the feed empties: neither this frame nor the app (which
                # takes self.first at mount) keeps the sample for the whole run.
                first = [first_sample(sampler)]
                self.first = first[0]
                if self._on_first is not None:
                    try:
                        self._on_first(first[0])
                    except Exception:  # the plain frame is a courtesy: sampling goes on
                        pass
                self.first_taken.set()
                self._attached.wait()
                feed = self._feed
                if feed is not None and not feed.stopped:
                    feed.run(sampler, first=first.pop())
        except Exception as exc:  # reported by the app, never as a traceback
            self.error = f"{type(exc).__name__}: {exc}"
            self.first_taken.set()
            if self._failed is not None and self._feed is not None and not self._feed.stopped:
                self._failed(self.error)


def first_sample(sampler):
    """The first frame's sample, without the agents' status or PCIe throughput: asking every
    agent socket on the host costs a few ms each (up to the probe's 0.5 s deadline when one is
    slow to answer), and the driver samples PCIe for 20 ms a read (GPUs without GPM); the first
    screen is the GPUs and their processes, and those columns come with the next tick (issue
    40: the first frame sooner)."""
    probe, sampler.agent_probe = sampler.agent_probe, None
    sampler.nvml.read_pcie = False
    try:
        return sampler.sample()
    finally:
        sampler.agent_probe = probe
        sampler.nvml.read_pcie = True
