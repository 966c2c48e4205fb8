"""What one tick of the live monitor costs, part by part, at 8 and at 64 simulated GPUs.

For each GPU count: the simulated NVML (the tour's boards, repeated to 64), a host with
~--processes processes (sleeping fillers started here, 4 of them shown on each GPU), the
agents' probe on, and the monitor's own feed (history, live rules, frames) on the sampling
thread, as `gputop top` runs it. Per tick it measures the CPU time (this thread's; the PCIe
reads run on helper threads and mostly sleep in the driver's 20 ms window) of:

- NVML: every GPU's reads (and how many NVML calls per GPU per tick);
- host: the host's figures (CPU, memory, disk, net) and the /proc passes (how many full
  listings of /proc a tick makes: the goal is one, shared by every consumer);
- processes: the GPU processes' rows (psutil reads of each, their workers, containers);
- agent probe: every agent's status (one deadline for all);
- history: the charts' ring buffers;
- live rules: LiveDiagnosis.update (every tick) and the findings (every 2 s of sampling);
- frame: the frame posted to the interface (chart windows cut, frozen).

and prints each part's mean CPU ms per tick (the rules' findings run every other tick) and
its share of the tick. Drawing the frame (Textual,
on the UI thread) is measured by benchmarks/bench_tui.py (GPUTOP_FRAME_LOG).

Usage: python benchmarks/bench_sampling.py [--ticks 120] [--processes 300] [--gpus 8,64]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputop.client.session import _agent_probe  # noqa: E402
from gputop.collect.nvml import NvmlCollector  # noqa: E402
from gputop.collect.sampler import Sampler  # noqa: E402
from gputop.sim import nvml as simnvml  # noqa: E402
from gputop.sim.scenarios import SCENARIOS  # noqa: E402
from gputop.tui.view.frames import SamplerFeed, build_frame  # noqa: E402

PARTS = ("NVML", "host", "processes", "agent probe", "history", "live rules", "frame")


class Counted:
    """Counts calls of a module's function by name (the bench's own instrumentation)."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()

    def wrap(self, module, name: str, label: str | None = None, when=None) -> None:
        original = getattr(module, name)

        def counted(*args, **kwargs):
            if when is None or when(*args, **kwargs):
                self.calls[label or name] += 1
            return original(*args, **kwargs)

        setattr(module, name, counted)


def timed_function(fn, label: str, spent: collections.Counter):
    def wrapper(*args, **kwargs):
        t = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.thread_time() - t
    return wrapper


def timed(obj, name: str, label: str, spent: collections.Counter) -> None:
    """Time ``obj.name``'s calls into ``spent[label]`` (CPU time of the calling thread)."""
    setattr(obj, name, timed_function(getattr(obj, name), label, spent))


def is_proc(path=".", *_a, **_k) -> bool:
    path = os.fsdecode(path) if isinstance(path, (str, bytes)) else str(path)
    return path.rstrip("/") == "/proc"


def scenario_of(gpus: int):
    tour = SCENARIOS["tour"]
    boards = [g for g in tour.gpus][:8]
    return dataclasses.replace(tour, gpus=tuple(boards[i % len(boards)] for i in range(gpus)))


def run(gpus: int, ticks: int, fillers: list[int], counted: Counted) -> dict:
    scenario = scenario_of(gpus)
    sim = simnvml.install(simnvml.SimulatedNvml(scenario, pcie_sample_s=simnvml.PCIE_SAMPLE_S))
    for i in range(gpus):
        sim.set_processes(i, fillers[4 * i % len(fillers):][:4])
    probe = _agent_probe()
    sampler = Sampler(NvmlCollector(None), agent_probe=probe, simulated="tour")
    sampler.open()
    feed = SamplerFeed(lambda frame: None, 1.0)
    spent: collections.Counter[str] = collections.Counter()
    timed(sampler.nvml, "sample", "NVML", spent)
    timed(sampler.host, "sample_host", "host", spent)
    sampler.agent_probe = timed_function(probe, "agent probe", spent)
    cpu: dict[str, list[float]] = {p: [] for p in PARTS}
    whole: list[float] = []
    nvml_calls: list[int] = []
    proc_passes: list[int] = []
    try:
        feed.record(sampler.sample())  # rates need a previous tick; the history is made
        timed(feed.history, "record", "history", spent)
        for tick in range(ticks):
            # One tick as the monitor runs it: sample, record (history, rules), build the
            # frame; its parts timed by wrappers around them.
            counted.calls.clear()
            spent.clear()
            t0 = time.thread_time()
            snap = sampler.sample()
            t1 = time.thread_time()
            feed.record(snap)
            t2 = time.thread_time()
            build_frame(feed.history, snap, feed.window, tick, None, feed.findings)
            t3 = time.thread_time()
            whole.append(t3 - t0)
            cpu["NVML"].append(spent["NVML"])
            cpu["host"].append(spent["host"])
            cpu["agent probe"].append(spent["agent probe"])
            cpu["processes"].append(t1 - t0 - spent["NVML"] - spent["host"]
                                    - spent["agent probe"])
            cpu["history"].append(spent["history"])
            cpu["live rules"].append(t2 - t1 - spent["history"])
            cpu["frame"].append(t3 - t2)
            nvml_calls.append(sum(n for k, n in counted.calls.items() if k.startswith("nvml")))
            proc_passes.append(counted.calls["/proc"])
            time.sleep(max(0.0, 0.25 - (t3 - t0)))  # a tick's spacing, shortened
    finally:
        sampler.close()
        simnvml.uninstall()
    return {"cpu": cpu, "whole": whole, "nvml_calls": statistics.median(nvml_calls) / gpus,
            "proc_passes": (statistics.median(proc_passes), max(proc_passes)), "gpus": gpus}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=120)
    parser.add_argument("--processes", type=int, default=300)
    parser.add_argument("--gpus", default="8,64")
    args = parser.parse_args()
    import pynvml

    counted = Counted()
    original_pointer = pynvml._nvmlGetFunctionPointer

    def pointer(name):  # every nvidia-ml-py call looks its C function up once per call
        counted.calls[name] += 1
        return original_pointer(name)

    pynvml._nvmlGetFunctionPointer = pointer
    counted.wrap(os, "listdir", "/proc", when=is_proc)
    counted.wrap(os, "scandir", "/proc", when=is_proc)
    fillers: list[subprocess.Popen] = []
    try:
        while len(psutil.pids()) < args.processes and len(fillers) < 400:
            fillers.append(subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL))
        pids = [p.pid for p in fillers] or [os.getpid()]
        host_processes = len(psutil.pids())
        results = [run(int(n), args.ticks, pids, counted) for n in args.gpus.split(",")]
    finally:
        for p in fillers:
            p.kill()
        for p in fillers:
            p.wait()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"host processes: {host_processes}; {args.ticks} ticks each; CPU time of the "
          f"sampling thread; load average {load} ({os.cpu_count()} CPUs)")
    for r in results:
        med = {p: statistics.fmean(v) * 1000 for p, v in r["cpu"].items()}
        parts = sum(med.values())
        print(f"\n{r['gpus']} GPUs, 4 processes each: whole tick mean "
              f"{statistics.fmean(r['whole']) * 1000:.2f} ms CPU (median "
              f"{statistics.median(r['whole']) * 1000:.2f}; sum of the parts' means "
              f"{parts:.2f} ms); NVML calls per GPU per tick: {r['nvml_calls']:.0f}; full "
              f"/proc listings per tick: median {r['proc_passes'][0]:.0f}, most "
              f"{r['proc_passes'][1]:.0f}")
        for p in PARTS:
            print(f"  {p:<12} {med[p]:7.2f} ms  {100 * med[p] / parts:5.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
