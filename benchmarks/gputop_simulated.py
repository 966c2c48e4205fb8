"""gputop as on a node, on gputop's simulated NVML, for benchmarks/bench_tui.py: the monitor's
own code path (no `--demo`), reading the same scenario and processes (GPUTOP_DEMO_PIDS) with the
same driver latency as nvitop in benchmarks/nvitop_simulated.py.

`gputop --demo SCENARIO` runs the simulation from gputop's demo path; this process instead puts
the simulated library behind nvidia-ml-py first (gputop/sim/nvml.py), exactly as
nvitop_simulated.py does for nvitop, then runs gputop's command line without `--demo`: both
monitors then carry the same simulator in their process, and gputop runs what it runs on a
node with a driver.

Usage: python benchmarks/gputop_simulated.py SCENARIO [gputop options]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputop.demo.attach import attached_pids  # noqa: E402
from gputop.sim import nvml as simnvml  # noqa: E402
from gputop.sim.scenarios import SCENARIOS  # noqa: E402


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in SCENARIOS:
        print(f"usage: {sys.argv[0]} SCENARIO [gputop options]; scenarios: "
              f"{', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    scenario = SCENARIOS[sys.argv[1]]
    sim = simnvml.install(simnvml.SimulatedNvml(scenario, pcie_sample_s=simnvml.PCIE_SAMPLE_S))
    for index, pids in attached_pids(len(scenario.gpus)).items():
        sim.set_processes(index, pids)
    from gputop.cli import main as gputop_main

    return int(gputop_main(sys.argv[2:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
