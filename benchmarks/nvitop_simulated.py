"""nvitop on gputop's simulated NVML, for benchmarks/bench_tui.py: the same scenario, the same
processes (GPUTOP_DEMO_PIDS) and the same driver latency as gputop (simulated_nvml.py).

nvitop reads NVML through nvidia-ml-py, as gputop does: this process puts the simulated
library behind those bindings (gputop/sim/nvml.py), then runs nvitop's own command line.

Usage: python benchmarks/nvitop_simulated.py SCENARIO [nvitop options]
"""

from __future__ import annotations

import sys

from simulated_nvml import put_in


def main() -> int:
    options = put_in(sys.argv, "nvitop")
    try:
        from nvitop.cli import main as nvitop_main
    except ImportError:
        print("nvitop is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    sys.argv = ["nvitop", *options]
    return int(nvitop_main() or 0)


if __name__ == "__main__":
    raise SystemExit(main())
