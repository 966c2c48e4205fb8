"""A real, small CPU training loop starved by its input pipeline, with the gputop agent.

``python -m gputop.demo.train`` is the process on simulated GPU 0 of ``gputop --demo
input-starved`` (when torch is installed), so a capture in the demo records real steps: the
DataLoader has ``num_workers=0`` and a heavy per-sample transform, the model is tiny, and most of
every step is spent waiting for the next batch. It runs until killed, and also ends when its
parent dies (PR_SET_PDEATHSIG plus a parent-pid watch), so a demo never leaves it behind.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
# A regression on demand (docs/simulated.md): `GPUTOP_DEMO_SLOWDOWN=30% gputop --demo
# input-starved record ...` records the same job with every step 30 % slower.
SLOWDOWN_ENV = "GPUTOP_DEMO_SLOWDOWN"
# A paced job (docs/simulated.md): one blur pass per sample and a sleep after every step, so
# that its step time hardly depends on the machine's load; runs made side by side on a busy
# machine then compare (the regression gate's tests).
PACE_ENV = "GPUTOP_DEMO_PACE_MS"


def slowdown_fraction(text: str) -> float:
    """'30%', '30' and '0.3' all mean thirty percent (0 to 500 %)."""
    raw = text.strip().rstrip("%")
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a percentage like 30% (got {text!r})") from None
    value = value / 100 if (text.strip().endswith("%") or value >= 1) else value
    if not 0 <= value <= 5:
        raise argparse.ArgumentTypeError(f"between 0% and 500% (got {text!r})")
    return value


def pace_ms(text: str) -> float:
    """A sleep per step in milliseconds, 0 to 10 000."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"milliseconds like 25 (got {text!r})") from None
    if not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"between 0 and 10000 ms (got {text!r})")
    return value


# After SIGTERM (or the parent's death) the loop stops at the next step; if it has not ended
# by then (blocked in the DataLoader, or in interpreter shutdown) it is ended without cleanup.
STOP_GRACE_S = 5.0


class StopFlag:
    """Set by the SIGTERM handler and the parent watch without a lock: a handler that takes
    a lock (threading.Event.set does) deadlocks when it interrupts code holding that lock,
    and a watch waiting on the same lock would then never end the process."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def end_with_parent(parent_pid: int, stop: StopFlag) -> None:
    """Stop when the parent dies or on SIGTERM, and leave for sure within STOP_GRACE_S.

    The signal handler only sets ``stop``: raising SystemExit from a handler can land while
    the main thread holds a multiprocessing queue's lock, and the queue's finalizer then waits
    on that lock for ever at exit (seen: a trainer left behind by its dead parent). PDEATHSIG
    follows the parent *thread*, and misses a parent that died before we asked, so the parent
    pid is watched too."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def watch() -> None:
        while not stop.is_set():
            if os.getppid() != parent_pid:
                stop.set()
                break
            time.sleep(0.5)
        time.sleep(STOP_GRACE_S)  # a daemon thread: a clean exit before this ends it
        os._exit(0)

    if os.getppid() != parent_pid:
        sys.exit(0)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


# DataLoader workers run below the trainer's priority: on a node with a core per process the
# trainer's own step is never descheduled by its workers, and on a small busy machine (the
# demo's, a test's) it should not be either, or a capture reads the wait as host work.
WORKER_NICE = 5


def lower_worker_priority(_worker_id: int) -> None:
    """A DataLoader worker's init: yield the CPU to the trainer when both want it."""
    try:
        os.nice(WORKER_NICE)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gputop.demo.train", description=__doc__)
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="end when this process is gone (default: our parent)",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--transform-passes",
        type=int,
        default=24,
        help="blur passes per sample: the cost of the input pipeline",
    )
    parser.add_argument(
        "--num-workers",
        type=int,
        default=0,
        help="DataLoader workers (the demo uses 2: each burns a core and still cannot keep up)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=0, help="stop after N steps (0: never)")
    parser.add_argument(
        "--slowdown",
        type=slowdown_fraction,
        default=os.environ.get(SLOWDOWN_ENV, "0"),
        metavar="PCT",
        help="make every step PCT slower (e.g. 30%%), to try `gputop report --baseline` on a "
        f"regression; default ${SLOWDOWN_ENV}, which `gputop --demo` passes on, else 0",
    )
    parser.add_argument("--step-sleep-ms", type=float, default=0.0,
                        help="sleep after each step (a light job beside the others)")
    parser.add_argument("--pace-ms", type=pace_ms, default=os.environ.get(PACE_ENV, "0"),
                        metavar="MS",
                        help="a paced job: one blur pass per sample and a sleep of MS after each "
                             "step (made PCT longer by --slowdown), so that its step time hardly "
                             f"depends on the machine's load; default ${PACE_ENV}, else 0")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the model, with epochs of 7 batches and a last "
                             "smaller one: it recompiles on the last batch (the `recompiles` "
                             "finding)")
    args = parser.parse_args(argv)
    if args.pace_ms:
        args.transform_passes = 1
        args.step_sleep_ms = args.pace_ms * (1 + args.slowdown)

    # A clean exit on SIGTERM, at a step boundary: atexit handlers run and the agent removes
    # its socket.
    stop = StopFlag()
    end_with_parent(args.parent_pid if args.parent_pid is not None else os.getppid(), stop)

    if args.compile:
        # A light job beside the tour's others: its start (torch's import, the compile) must
        # not take the CPU the input-starved trainer's workers need.
        os.nice(10)

    import gputop.agent

    gputop.agent.install()

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # one busy core, like a real num_workers=0 input pipeline

    class AugmentedImages(Dataset):
        """Synthetic 3x64x64 images behind a deliberately expensive augmentation."""

        def __init__(self, passes: int) -> None:
            self.passes = passes
            self.kernel = torch.full((3, 1, 5, 5), 1.0 / 25)

        def __len__(self) -> int:
            # Compiled: 7 full batches and a last one of 7 samples, a new shape.
            return 7 * args.batch_size + 7 if args.compile else 100_000

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            started = time.thread_time()
            item = self.make(index)
            if args.slowdown:
                # The input pipeline is the bottleneck: give it PCT more CPU work, the step
                # follows. CPU work, not a sleep: on a busy machine a sleeping worker hands its
                # core to the other worker and the step would hardly slow down.
                extra = (time.thread_time() - started) * args.slowdown
                until = time.thread_time() + extra
                while time.thread_time() < until:
                    pass
            return item

        def make(self, index: int) -> tuple[torch.Tensor, int]:
            g = torch.Generator().manual_seed(args.seed * 1_000_003 + index)
            image = torch.rand(1, 3, 64, 64, generator=g)
            for _ in range(self.passes):  # a blur applied many times: CPU work per sample
                image = nn.functional.conv2d(image, self.kernel, padding=2, groups=3)
                image = (image - image.mean()) / (image.std() + 1e-5)
            image = nn.functional.interpolate(image, size=32, mode="bilinear")
            return image[0], index % 10

    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    forward: Callable[[torch.Tensor], torch.Tensor] = model
    if args.compile:
        if hasattr(torch._dynamo.config, "automatic_dynamic_local_pgo"):
            torch._dynamo.config.automatic_dynamic_local_pgo = False  # as a first run does
        # Static shapes, as a model compiled for its batch size is: the last batch recompiles.
        def step_forward(images: torch.Tensor) -> torch.Tensor:
            return model(images)

        forward = torch.compile(step_forward, backend="eager", dynamic=False)
    loader = DataLoader(
        AugmentedImages(args.transform_passes),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        worker_init_fn=lower_worker_priority,
    )
    step = 0
    try:
        while True:
            for images, labels in loader:
                loss = nn.functional.cross_entropy(forward(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                if args.step_sleep_ms:
                    time.sleep(args.step_sleep_ms / 1000)
                if stop.is_set() or (args.steps and step >= args.steps):
                    return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
