"""After `benchmarks/gpu/run_real_jobs.sh` on a real GPU: what the agent's step breakdown read for
each job, and whether the live rules, replayed over each recording, name the job's cause.

    benchmarks/gpu/run_real_jobs.sh OUT 16 && python benchmarks/gpu/check_replay.py OUT/rec

For every recording in the folder whose name has a label in ``tests/data/realgpu/labels.tsv``
(the same jobs: healthy, starved, hostbound, pcie, tinykernels, leak, sync), prints the means
over the job's steady samples (after its first step) of utilization, SM activity, PCIe RX, and
the agent's ``dataloader_wait_share``, ``sync_wait_share`` and ``host_busy_share`` (this
branch's agent times device syncs and the training thread's own work), then the replay's
verdict as ``benchmarks/bench_live_accuracy.py`` scores it. What to look for: ``sync`` reads a
``sync_wait_share`` above 0 (its per-step ``.item()`` waits on the GPU) and the others ~0;
``hostbound`` and ``tinykernels`` a ``host_busy_share`` near 1; ``starved`` a DataLoader wait
near 0.9.

Exit status 0 when every labelled recording is right with no false alarm.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gputop.recording.accuracy import Label, read_labels_tsv, score  # noqa: E402
from gputop.recording.replay import open_replay  # noqa: E402

AGENT = ("dataloader_wait_share", "sync_wait_share", "host_busy_share")


def _mean(values: list[float]) -> str:
    return f"{statistics.fmean(values):.2f}" if values else "n/a"


def steady_means(path: Path) -> dict[str, str]:
    """Means over the samples after the first step (start-up left out)."""
    series: dict[str, list[float]] = {k: [] for k in ("util", "sm", "rx_gbs", *AGENT)}
    stepping = False
    for snap in open_replay(path).snapshots():
        for gpu in snap.gpus:
            procs = [p for p in gpu.processes if p.visible and p.agent]
            stepping = stepping or any(p.agent.steps for p in procs if p.agent)
            if not stepping:
                continue
            for key, value in (("util", gpu.util_gpu), ("sm", gpu.sm_active),
                               ("rx_gbs", (gpu.pcie_rx_mbs or 0) / 1000)):
                if value is not None:
                    series[key].append(value)
            for p in procs:
                for key in AGENT:
                    value = getattr(p.agent, key)
                    if isinstance(value, (int, float)):
                        series[key].append(float(value))
    return {k: _mean(v) for k, v in series.items()}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.strip().splitlines()[2])
        return 2
    folder = Path(argv[0])
    known = {label.name: label for label in read_labels_tsv(REPO / "tests" / "data" / "realgpu")}
    ok = True
    for path in sorted(p for p in folder.iterdir() if p.name in known):
        label = Label(path.name, path, known[path.name].expect, known[path.name].allow)
        means = steady_means(path)
        outcome = score(label)
        right = outcome.right and not outcome.false_alarms
        ok &= right
        print(f"{path.name:<12} util {means['util']:>6} SM {means['sm']:>6} "
              f"rx {means['rx_gbs']:>6} GB/s  wait {means['dataloader_wait_share']:>5} "
              f"sync {means['sync_wait_share']:>5} busy {means['host_busy_share']:>5}  "
              f"raised {', '.join(outcome.actionable) or '-'}  "
              f"{'right' if right else 'WRONG'} {', '.join(outcome.false_alarms)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
