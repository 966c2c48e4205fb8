"""What containers and MIG cost a sampling tick (issue 29), measured in this one run.

* NVML part of a tick (median, p95, driver calls) for one H100 in MIG mode with seven MIG devices
  (`--demo mig`) against the same board without MIG (`--demo memory-leak`), on the simulated
  driver (its 20 ms PCIe wait off: the same in both);
* a whole tick of `--demo mig` with the owners and container pids read (cached per process)
  against one that reads them afresh every tick (what the cache saves);
* one scan of every process's fd table for device-file holders (the elimination in a
  container; done at most every 10 s), on this host with its process count.

Usage: python benchmarks/bench_containers.py [--ticks N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import psutil
from harness import percentile  # noqa: E402

from gputop.client.session import open_sampler
from gputop.collect.containers import read_owner
from gputop.core.pidns import device_holders, ns_pid
from gputop.sim import nvml as simnvml


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1e3:.2f} ms, p95 {percentile(values, 0.95) * 1e3:.2f} ms"


def nvml_ticks(demo: str, ticks: int) -> tuple[list[float], float]:
    with open_sampler(demo, agents=False, wait_for_workers=5.0) as sampler:
        from gputop.sim.nvml import installed

        sim = installed()
        sampler.sample()
        before = sum(sim.calls.values())
        times = []
        for _ in range(ticks):
            t0 = time.perf_counter()
            sampler.nvml.sample()
            times.append(time.perf_counter() - t0)
        calls = (sum(sim.calls.values()) - before) / ticks
    return times, calls


def whole_ticks(ticks: int, cached: bool) -> list[float]:
    with open_sampler("mig", agents=False, wait_for_workers=5.0) as sampler:
        if not cached:  # read afresh every time: what the per-process cache saves
            sampler.identity.get = lambda pid, _ct: (ns_pid(pid), read_owner(pid))
        sampler.sample()
        times = []
        for _ in range(ticks):
            t0 = time.perf_counter()
            sampler.sample()
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=200)
    args = parser.parse_args()
    # The simulated PCIe read waits 20 ms per call as a real one does, the same with and
    # without MIG: off here, so the tick shows what MIG adds.
    simnvml.PCIE_SAMPLE_S = 0.0

    mig, mig_calls = nvml_ticks("mig", args.ticks)
    plain, plain_calls = nvml_ticks("memory-leak", args.ticks)
    print(f"NVML part of a tick, H100 with 7 MIG devices: {ms(mig)}, {mig_calls:.0f} driver calls")
    print(f"NVML part of a tick, the same H100 without MIG: {ms(plain)}, "
          f"{plain_calls:.0f} driver calls")
    print(f"  ratio (medians): {statistics.median(mig) / statistics.median(plain):.2f}x")

    cached = whole_ticks(args.ticks, cached=True)
    fresh = whole_ticks(args.ticks, cached=False)
    print(f"whole tick of --demo mig (5 processes), owners cached: {ms(cached)}")
    print(f"whole tick of --demo mig, owners read every tick:     {ms(fresh)}")

    scans = []
    for _ in range(20):
        t0 = time.perf_counter()
        device_holders(range(8))
        scans.append(time.perf_counter() - t0)
    print(f"device-file holder scan of {len(psutil.pids())} processes: {ms(scans)} "
          "(at most every 10 s, only in a container with unnamed host pids)")


if __name__ == "__main__":
    main()
