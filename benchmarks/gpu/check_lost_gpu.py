"""On a real GPU node: the lost-GPU check (INVALID_ARGUMENT, then the UUID) never calls a healthy
GPU lost, and what the driver refuses is only marked unsupported.

    python benchmarks/gpu/check_lost_gpu.py [--seconds 30]

Samples every GPU once a second with the real collector, prints per GPU the fields the driver
refused (and so are no longer asked) and whether any GPU was reported lost, and exits 1 if one
was. Prints the driver's answer to the GPU count and version (the snapshot's "no GPUs: ..." and
"driver n/a" cases).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gputop.collect.nvml import NvmlCollector  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    collector = NvmlCollector()
    driver = collector.open()
    print(f"driver available={driver.available} version={driver.driver_version} "
          f"cuda={driver.cuda_version} error={driver.error}")
    if not driver.available:
        return 1
    lost: set[int] = set()
    ticks = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.seconds:
            for sample, _, _ in collector.sample():
                if sample.lost:
                    lost.add(sample.index)
            ticks += 1
            time.sleep(1.0)
    finally:
        for dev in collector.devices:
            print(f"GPU {dev.index} {dev.name}: refused fields: "
                  f"{', '.join(sorted(dev.unsupported)) or 'none'}")
        collector.close()
    print(f"{ticks} ticks over {len(collector.devices)} GPUs; lost: {sorted(lost) or 'none'}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
