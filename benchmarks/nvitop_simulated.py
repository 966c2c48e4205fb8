"""nvitop on gputop's simulated NVML, for benchmarks/bench_tui.py: the same scenario, the same
processes (GPUTOP_DEMO_PIDS) and the same driver latency as `gputop --demo SCENARIO`.

nvitop reads NVML through nvidia-ml-py, as gputop does: this process puts the simulated
library behind those bindings (gputop/sim/nvml.py), then runs nvitop's own command line.

Usage: python benchmarks/nvitop_simulated.py SCENARIO [nvitop options]
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
        print(f"usage: {sys.argv[0]} SCENARIO [nvitop options]; scenarios: "
              f"{', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    scenario = SCENARIOS[sys.argv[1]]
    sim = simnvml.install(simnvml.SimulatedNvml(scenario, pcie_sample_s=simnvml.PCIE_SAMPLE_S))
    for index, pids in attached_pids(len(scenario.gpus)).items():
        sim.set_processes(index, pids)
    try:
        from nvitop.cli import main as nvitop_main
    except ImportError:
        print("nvitop is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    sys.argv = ["nvitop", *sys.argv[2:]]
    return int(nvitop_main() or 0)


if __name__ == "__main__":
    raise SystemExit(main())
