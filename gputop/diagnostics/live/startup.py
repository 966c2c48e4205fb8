"""Which GPUs are starting up: no cause is named for a GPU while a job on it starts.

A training job's first seconds look like every stall: the CUDA context is created, the model
is built and copied, the first batches are loaded, while the GPU idles and the CPU runs flat
out (on an H200: 6-7 s of 0 % utilization at 100 % CPU before the first step). What ends
start-up:

* a process with the agent: its first optimizer step (the agent counts them). A job that never
  steps an optimizer (inference, a copy loop) is not starting once its GPU has worked a whole
  window (``WINDOW_S``);
* a process without the agent: the first sample in which its GPU works (a kernel or a copy ran:
  utilization >= 1 %), the proxy of a first step from outside;
* either way, an age of ``STARTUP_MAX_S``: a job that has done nothing for that long is not
  starting but stuck, and the idle and hang rules may then judge it.

A process's age is taken from its start time when the sample has it, else from when it was
first seen.
"""

from __future__ import annotations

from gputop.core.model import ProcSample, Snapshot
from gputop.diagnostics.live.common import WINDOW_S, WORKED_UTIL, agent_steps

STARTUP_MAX_S = 30.0


class StartUp:
    """Fed every snapshot in time order; says which GPUs are in a job's start-up."""

    def __init__(self) -> None:
        self._first_seen: dict[int, float] = {}  # pid -> first time it was on a GPU
        self._first_work: dict[tuple[int, int], float] = {}  # (GPU, pid) -> GPU first worked

    def update(self, snap: Snapshot) -> set[int]:
        """The indices of the GPUs of ``snap`` on which a visible process is starting."""
        now = snap.time
        present: set[int] = set()
        starting: set[int] = set()
        for gpu in snap.gpus:
            if gpu.lost:
                continue
            worked = (gpu.util_gpu or 0) >= WORKED_UTIL
            for proc in gpu.processes:
                if not proc.visible:
                    continue
                present.add(proc.pid)
                seen = self._first_seen.setdefault(proc.pid, now)
                key = (gpu.index, proc.pid)
                if worked:
                    self._first_work.setdefault(key, now)
                if self._starting(proc, now, seen, self._first_work.get(key)):
                    starting.add(gpu.index)
        for pid in [p for p in self._first_seen if p not in present]:
            del self._first_seen[pid]
        for key in [k for k in self._first_work if k[1] not in present]:
            del self._first_work[key]
        return starting

    @staticmethod
    def _starting(proc: ProcSample, now: float, seen: float, first_work: float | None) -> bool:
        born = proc.create_time
        if born is None or born != born or born > now:
            born = seen
        if now - born >= STARTUP_MAX_S:
            return False
        steps = agent_steps(proc)
        if steps is not None:
            # The agent knows the first step; without one, a GPU that has worked a whole
            # window runs a job that does not step an optimizer.
            return steps == 0 and (first_work is None or now - first_work < WINDOW_S)
        return first_work is None
