"""gputop's simulated NVML put behind nvidia-ml-py in this process, for a monitor that
benchmarks/bench_tui.py runs on it (gputop_simulated.py, nvitop_simulated.py): the same
scenario, the same processes (GPUTOP_DEMO_PIDS) and the same driver latency for both."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputop.demo.attach import attached_pids  # noqa: E402
from gputop.sim import nvml as simnvml  # noqa: E402
from gputop.sim.scenarios import SCENARIOS  # noqa: E402


def put_in(argv: list[str], monitor: str) -> list[str]:
    """Install the scenario named by ``argv[1]``, with $GPUTOP_DEMO_PIDS' processes on its
    GPUs; the monitor's own options (``argv[2:]``). A missing or unknown scenario: usage on
    stderr, exit 2."""
    if len(argv) < 2 or argv[1] not in SCENARIOS:
        print(f"usage: {argv[0]} SCENARIO [{monitor} options]; scenarios: "
              f"{', '.join(SCENARIOS)}", file=sys.stderr)
        raise SystemExit(2)
    scenario = SCENARIOS[argv[1]]
    sim = simnvml.install(simnvml.SimulatedNvml(scenario, pcie_sample_s=simnvml.PCIE_SAMPLE_S))
    for index, pids in attached_pids(len(scenario.gpus)).items():
        sim.set_processes(index, pids)
    return argv[2:]
