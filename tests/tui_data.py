"""Fixed, deterministic snapshots for the TUI tests: GPU readings from the simulated driver on a
scripted clock (the real NVML collector over the simulated library), with process and host rows
written out here so no pid, user or load of the test machine leaks into a screenshot."""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import replace

from gputop.collect.nvml import NvmlCollector
from gputop.core.model import DriverInfo, GpuSample, HostSample, ProcSample, Snapshot, WorkerSample
from gputop.sim import nvml as simnvml
from gputop.sim.scenarios import SCENARIOS
from tests.conftest import SLOW

START = 1_767_261_600.0  # 2026-01-01 10:00:00 UTC: any fixed time will do
GIB = 1024**3
MIB = 1024**2


class _Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def _host(i: int, busy: float) -> HostSample:
    cores = tuple(min(100.0, busy * (0.6 + 0.1 * (c % 5)) + (i % 3)) for c in range(32))
    return HostSample(
        hostname="node-07",
        cpu_percent=round(sum(cores) / len(cores), 1),
        cpu_per_core=cores,
        cpu_count=len(cores),
        iowait=1.5,
        steal=0.0,
        load_1=14.2,
        load_5=13.8,
        load_15=12.9,
        memory_used=180 * GIB,
        memory_total=503 * GIB,
        swap_used=0,
        swap_total=8 * GIB,
        disk_read_bps=420.0 * MIB,
        disk_write_bps=12.0 * MIB,
        net_rx_bps=95.0 * MIB,
        net_tx_bps=3.0 * MIB,
        process_count=612,
    )


def _processes(gpu: GpuSample, kind: str, n_workers: int, step: int) -> tuple[ProcSample, ...]:
    if gpu.lost:
        return ()
    pid = 4100 + 100 * gpu.index
    starved = kind == "input-starved"
    workers = tuple(
        WorkerSample(pid=pid + 1 + k, name="pt_data_worker",
                     cpu_percent=99.0 if starved else 12.0 + k + step % 3,
                     rss=900 * MIB, state="running" if starved else "sleeping")
        for k in range(n_workers)
    )
    main_cpu = {"host-sync": 30.0, "idle": 0.0, "input-starved": 8.0, "host-bound": 100.0,
                "tiny-kernels": 99.0}.get(kind, 35.0)
    if kind == "host-sync":  # asleep in a sync while its GPU works, running while it idles
        state = "sleeping" if (gpu.util_gpu or 0) >= 50 else "running"
    else:
        state = "sleeping" if starved else "running"
    return (
        ProcSample(
            pid=pid,
            name="python",
            gpu_mem=gpu.mem_used - 600 * MIB if gpu.mem_used else None,
            sm_util=gpu.util_gpu,
            cpu_percent=main_cpu,
            rss=6 * GIB,
            user="alice",
            state=state,
            threads=24,
            create_time=START - 3600,
            cmdline=f"/opt/conda/bin/python train.py --config {kind}.yaml --gpu {gpu.index}",
            workers=workers,
        ),
    )


def scenario_snapshots(name: str = "tour", count: int = 90, interval: float = 1.0,
                       seed: int = 0) -> list[Snapshot]:
    """``count`` snapshots of scenario ``name``, ``interval`` simulated seconds apart."""
    scenario = SCENARIOS[name]
    clock = _Clock()
    sim = simnvml.install(simnvml.SimulatedNvml(scenario, seed=seed, clock=clock))
    try:
        for index in range(len(scenario.gpus)):
            sim.set_processes(index, [])
        collector = NvmlCollector()
        driver = collector.open()
        driver = replace(driver, simulated=None)
        snaps = []
        for step in range(count):
            clock.t = step * interval
            gpus = []
            for (sample, _procs, _util), behaviour in zip(collector.sample(), scenario.gpus):
                procs = _processes(sample, behaviour.kind, behaviour.workers, step)
                gpus.append(replace(sample, processes=procs))
            busy = 55.0 + 10 * (step % 4)
            snaps.append(Snapshot(time=START + clock.t, host=_host(step, busy),
                                  driver=driver, gpus=tuple(gpus)))
        collector.close()
        return snaps
    finally:
        simnvml.uninstall()


def with_process(snaps: list[Snapshot], proc: ProcSample, gpu: int = 0) -> list[Snapshot]:
    """The same snapshots with ``proc`` (a real process of the test) added to GPU ``gpu``."""
    out = []
    for snap in snaps:
        gpus = tuple(
            replace(g, processes=(proc, *g.processes)) if g.index == gpu else g
            for g in snap.gpus
        )
        out.append(replace(snap, gpus=gpus))
    return out


NO_DRIVER = DriverInfo(available=False, error="NVML Shared Library Not Found")


def screen_text(app) -> str:
    """What the terminal would show, as plain text (for assertions and for reading failures)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system=None, record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True,
                                                         screen_stack=app._background_screens))
    return console.export_text()


def run_async(test):
    """Run an async test on a fresh event loop (no asyncio plugin is needed)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return wrapper


async def until(pilot, condition, timeout: float = SLOW, interval: float = 0.02):
    """Let the app run until ``condition()`` holds; fail after ``timeout`` seconds with what
    the screen shows."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {condition}\n"
                                 + screen_text(pilot.app))
        await pilot.pause(interval)


async def show_next(pilot, snap: Snapshot) -> None:
    """Record ``snap`` in the app's history and wait until the frame it makes is painted."""
    app = pilot.app
    app.feed.history.record(snap)
    seq = app.feed.latest_seq
    app.feed.request_frame()
    await until(pilot, lambda: app.frame.seq > seq)
    await pilot.pause()  # painted
