"""gputop as on a node, on gputop's simulated NVML, for benchmarks/bench_tui.py: the monitor's
own code path (no `--demo`), reading the same scenario and processes (GPUTOP_DEMO_PIDS) with the
same driver latency as nvitop in nvitop_simulated.py (simulated_nvml.py for both).

`gputop --demo SCENARIO` runs the simulation from gputop's demo path; this process instead puts
the simulated library behind nvidia-ml-py first, exactly as for nvitop, then runs gputop's
command line without `--demo`: both monitors then carry the same simulator in their process,
and gputop runs what it runs on a node with a driver.

Usage: python benchmarks/gputop_simulated.py SCENARIO [gputop options]
"""

from __future__ import annotations

import sys

from simulated_nvml import put_in


def main() -> int:
    options = put_in(sys.argv, "gputop")
    from gputop.cli import main as gputop_main

    return int(gputop_main(options) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
