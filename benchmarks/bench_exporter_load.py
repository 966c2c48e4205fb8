"""A well-behaved scraper's latency on `gputop exporter`, idle and under load.

Starts a real exporter (`--demo tour`: 10 GPUs, their jobs and findings), then:

1. idle: one normal scraper (a GET /metrics every --every seconds, as Prometheus does) for
   --idle seconds;
2. load: the same scraper for --duration seconds (60) while, in another process, --scrapers
   (20) clients scrape back to back and --slow (50) slow-loris clients each hold a connection
   open, sending a request a byte at a time (one every 0.5-5 s), and reconnect when dropped.

Prints the normal scraper's p50, p95 and max in both phases, the ratio (goal: p95 under load
<= 2x idle), how many scrapes failed, and the exporter's own CPU during the load (per scrape
and as a share of one core): where that share is small, the normal scraper's wait under load
is the kernel's run queue (the load's 70 threads on the same cores), not the exporter; rerun
with ``--nice -15`` (root) to give the exporter the CPU first and see that wait go.
Prometheus' default scrape timeout is 10 s.

    python benchmarks/bench_exporter_load.py [--duration 60] [--scrapers 20] [--slow 50]
                                             [--nice N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str, timeout: float = 30.0) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = response.read()
    if b"gputop_gpu_utilization_percent" not in body:
        raise RuntimeError("a scrape without the GPU series")
    return time.perf_counter() - started


def measure(url: str, seconds: float, every: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    failed = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            latencies.append(scrape(url, timeout=10.0))
        except (OSError, RuntimeError):
            failed += 1
        time.sleep(max(0.0, every - (time.monotonic() - start)))
    return latencies, failed


def _busy_scraper(url: str, stop: threading.Event, counts: list[int]) -> None:
    while not stop.is_set():
        try:
            scrape(url)
            counts[0] += 1
        except (OSError, RuntimeError):
            counts[1] += 1


def _slow_client(host: str, port: int, stop: threading.Event, rng: random.Random) -> None:
    request = f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\nX-Pad: {'a' * 200}\r\n\r\n"
    while not stop.is_set():
        try:
            with socket.create_connection((host, port), timeout=30) as s:
                for byte in request.encode()[:-1]:  # never the last byte: never a whole request
                    if stop.wait(rng.uniform(0.5, 5.0)):
                        return
                    s.sendall(bytes([byte]))
        except OSError:
            stop.wait(0.2)  # dropped: come back, as an attacker would


def load(url: str, host: str, port: int, scrapers: int, slow: int, seconds: float,
         done: multiprocessing.Queue) -> None:
    stop = threading.Event()
    counts = [0, 0]
    threads = [threading.Thread(target=_busy_scraper, args=(url, stop, counts), daemon=True)
               for _ in range(scrapers)]
    threads += [threading.Thread(target=_slow_client,
                                 args=(host, port, stop, random.Random(i)), daemon=True)
                for i in range(slow)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    done.put(tuple(counts))


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU, s (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(latencies: list[float]) -> tuple[float, float, float]:
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return statistics.median(ordered), p95, ordered[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="load phase, s (60)")
    parser.add_argument("--idle", type=float, default=20.0, help="idle phase, s (20)")
    parser.add_argument("--scrapers", type=int, default=20)
    parser.add_argument("--slow", type=int, default=50)
    parser.add_argument("--every", type=float, default=0.5, help="the normal scraper's period")
    parser.add_argument("--nice", type=int, default=0,
                        help="run the exporter at this nice value (below 0 needs root)")
    args = parser.parse_args()

    host, port = "127.0.0.1", free_port()
    url = f"http://{host}:{port}/metrics"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    nice = ["nice", "-n", str(args.nice)] if args.nice else []
    exporter = subprocess.Popen([*nice, sys.executable, "-m", "gputop", "--demo", "tour", "--interval",
                                 "1", "exporter", "--listen", f"{host}:{port}"],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                scrape(url, timeout=5.0)
                break
            except (OSError, RuntimeError):
                if exporter.poll() is not None or time.monotonic() > deadline:
                    print("the exporter did not start:", exporter.stderr.read(), file=sys.stderr)
                    return 1
                time.sleep(0.5)
        time.sleep(3)  # a few ticks: the jobs' series are in
        idle, idle_failed = measure(url, args.idle, args.every)
        done: multiprocessing.Queue = multiprocessing.Queue()
        loader = multiprocessing.Process(target=load, args=(url, host, port, args.scrapers,
                                                            args.slow, args.duration + 2, done))
        loader.start()
        time.sleep(2)  # the slow clients have connected
        cpu_before, started = cpu_seconds(exporter.pid), time.monotonic()
        busy, busy_failed = measure(url, args.duration, args.every)
        cpu_load, load_s = cpu_seconds(exporter.pid) - cpu_before, time.monotonic() - started
        counts = done.get(timeout=120)
        loader.join(timeout=30)
    finally:
        exporter.terminate()
        try:
            exporter.wait(timeout=20)
        except subprocess.TimeoutExpired:
            exporter.kill()
    i50, i95, imax = summary(idle)
    b50, b95, bmax = summary(busy)
    print(f"exporter: --demo tour, {args.scrapers} back-to-back scrapers, {args.slow} slow-loris "
          f"clients, {args.duration:g} s; a normal scraper every {args.every:g} s "
          f"(load avg {os.getloadavg()[0]:.1f})")
    print(f"{'':8}{'scrapes':>8}{'failed':>8}{'p50 s':>9}{'p95 s':>9}{'max s':>9}")
    print(f"{'idle':8}{len(idle):8d}{idle_failed:8d}{i50:9.3f}{i95:9.3f}{imax:9.3f}")
    print(f"{'load':8}{len(busy):8d}{busy_failed:8d}{b50:9.3f}{b95:9.3f}{bmax:9.3f}")
    print(f"load/idle: p50 {b50 / i50:.2f}x, p95 {b95 / i95:.2f}x (goal: p95 <= 2x); the busy "
          f"scrapers made {counts[0]} scrapes ({counts[1]} failed)")
    rate = counts[0] / (args.duration + 2)
    print(f"exporter CPU under load: {cpu_load:.2f} s in {load_s:.0f} s ({cpu_load / load_s:.0%} "
          f"of a core, sampling included), {1000 * cpu_load / max(1.0, rate * load_s):.3f} ms a "
          f"scrape{f'; exporter at nice {args.nice}' if args.nice else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
