"""`gputop top` (and `gputop` alone): the live monitor."""

from __future__ import annotations

import argparse
import gc
import os
import sys

from gputop.core.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "top",
        parents=[common],
        help="the live monitor (the default command)",
        description="Live GPUs, host and training processes with their DataLoader workers, "
        "and the findings of the live rules. Keys: q quit, P pause, 1-4 chart window, "
        "c compact, s/S sort, / filter, t tree, a every process with an agent, Enter process "
        "view, e environment, space tag, k signal TERM/INT/KILL (asks first), "
        "p capture 3 steps and diagnose them (with the gputop agent; on a rank of a job, every "
        "rank at the same steps; without the agent, the process's Python stacks sampled with "
        "py-spy), ? help. "
        "With --hosts/--hostfile/--slurm: every node over ssh on one screen (Enter: a node's "
        "screen, p: capture on the node, r: retry a node now). With --replay DIR: a "
        "recording played back, its charts, processes and the live rules' findings as they "
        "were (space pause, left/right step a sample, [ ] seek a minute, Home/End). "
        "Respects NO_COLOR.",
    )
    p.add_argument(
        "--replay",
        metavar="DIR",
        help="play back a `gputop record` directory instead of sampling: the same screen, at "
        "the pace it was recorded, with the findings of the live rules run over it (as "
        "`gputop replay DIR` prints them)",
    )
    p.add_argument(
        "--auto-capture",
        action="store_true",
        help="when a stall finding (dataloader-stall, host-sync, host-bound, launch-bound, "
        "gpu-idle, pcie-bound) raises on a process with the gputop agent, capture it by itself (at most "
        "once per 10 minutes per process) and show the verdict and trace under the finding; "
        "on a process without the agent, sample its Python stacks (py-spy) and show where it "
        "is instead",
    )


    p.add_argument(
        "--readonly",
        action="store_true",
        help="watch only: no signals (k) and no captures (p, m, F, h, --auto-capture), for a "
        "monitor left open on a shared screen or run by someone who must not act on the jobs",
    )


def one_blas_thread() -> None:
    """numpy's OpenBLAS starts a thread per core when numpy is imported (15 more threads, and
    their buffers, on a 16-core GPU node). The live monitor loads no numpy (its
    history and charts are pure Python); a recording read by --replay may, and one thread
    does that small work at the same cost. A value the user set is kept."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def one_malloc_arena() -> None:
    """glibc gives each thread that allocates its own malloc arena, each with its own free
    space; the monitor's threads allocate little and seldom, so one shared arena holds the same
    with less memory kept (~0.8 MiB of RSS on the tour). Set before the threads start; a
    MALLOC_ARENA_MAX the user set is kept, and a libc without mallopt is left alone."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-8, 1)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def run(args: argparse.Namespace) -> int:
    from gputop.fleet.options import requested as fleet_requested
    from gputop.fleet.prometheus.options import prometheus_requested

    if prometheus_requested(args):  # --prometheus URL: the fleet and its jobs from the store
        from gputop.commands.prom_fleet import run_prom_top

        return run_prom_top(args)
    if fleet_requested(args):  # --hosts, --hostfile, --slurm: the fleet screen
        if getattr(args, "replay", None):
            raise UsageError("--replay plays a recording of this node: it takes no --hosts, "
                             "--hostfile or --slurm")
        from gputop.commands.fleet import run_fleet_top

        return run_fleet_top(args)
    if getattr(args, "replay", None):
        return _run_replay(args)  # the recording first: a bad one is its own one line
    _need_terminal("")
    from gputop.tui.monitor.early_start import EarlySampler

    # No cyclic garbage collection until the first frames are drawn (the app collects once
    # and turns it back on then, freeze_startup_objects): importing and building the
    # interface allocates ~100 000 objects, and the collector walked them over and over on
    # the way, ~10 % of the CPU to the first frame.
    gc.disable()
    one_blas_thread()
    one_malloc_arena()
    # The driver opens (and a demo starts) while the interface is imported and built; the
    # first sample is painted as plain text meanwhile (plain_frame.py).
    plain = _plain_first_frame()
    early = EarlySampler(args.demo, args.gpus, args.seed,
                         on_first=None if plain is None else plain.paint).start()
    if plain is not None:
        # The first sample and its plain frame first: importing the interface meanwhile
        # would halve the sampler's share of the interpreter (the GIL) and delay both.
        early.first_taken.wait(FIRST_SAMPLE_WAIT_S)
    try:
        from gputop.tui.textual_fixes.lean_imports import lean_imports

        with lean_imports():  # Textual without TLS, its command palette and more: RSS
            from gputop.tui.monitor.app import GputopApp

        app = GputopApp(demo=args.demo, gpus=args.gpus, interval=args.interval, seed=args.seed,
                        auto_capture=getattr(args, "auto_capture", False), early=early,
                        readonly=getattr(args, "readonly", False))
    except BaseException:
        if plain is not None:
            plain.leave()
        raise
    if plain is not None:
        plain.close()  # the interface takes the terminal from here
    code = app.run()
    early.stop()
    if app.error:
        print(f"gputop: error: the sampler stopped: {app.error}", file=sys.stderr)
        code = 1
    # Everything is cleaned up by now: Textual restored the terminal, and the sampler thread
    # (joined above) stopped the demo processes. Tearing down an
    # interpreter that holds Textual and pandas costs a noticeable fraction of a second after
    # q; leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0))


# How long the interface waits for the first sample before it loads all the same (a slow
# driver: the interface then tells that the sampler is starting).
FIRST_SAMPLE_WAIT_S = 1.0


def _plain_first_frame():
    """The first sample as plain text before the interface loads, unless
    GPUTOP_PLAIN_FIRST_FRAME=0 (a terminal that mishandles the alternate screen)."""
    if os.environ.get("GPUTOP_PLAIN_FIRST_FRAME", "1") == "0":
        return None
    from gputop.tui.monitor.plain_frame import PlainFirstFrame

    return PlainFirstFrame(sys.stdout.fileno())


# A replay keeps its samples in memory: this many at most (5.5 h at 1 s; a snapshot of a few
# GPUs and their processes takes a few KiB).
MAX_REPLAY_SAMPLES = 20_000


def _need_terminal(hint: str) -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("the live monitor needs a terminal; for text output use "
                         f"`gputop snapshot`{hint}")


def _run_replay(args: argparse.Namespace) -> int:
    """`gputop top --replay DIR`: the monitor's screen over a recording."""
    from itertools import islice
    from pathlib import Path

    from gputop.recording.replay import open_replay
    from gputop.recording.store import RecordingError

    if args.demo is not None:
        raise UsageError("--replay plays a recording: it takes no --demo")
    try:
        replay = open_replay(Path(args.replay))
        snapshots = list(islice(replay.snapshots(), MAX_REPLAY_SAMPLES))
    except RecordingError as exc:
        raise UsageError(str(exc), exit_code=1) from None
    if not snapshots:
        raise UsageError(f"{args.replay} holds no sample that could be replayed"
                         + (f": {replay.problems[0]}" if replay.problems else ""), exit_code=1)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        for line in replay.problems:  # what the screen would have skipped, named all the same
            print(f"gputop: replay: {line}", file=sys.stderr)
    _need_terminal(" (`gputop replay DIR` for a recording)")
    from gputop.tui.monitor.replay_feed import ReplayFeed
    from gputop.tui.textual_fixes.lean_imports import lean_imports

    with lean_imports():
        from gputop.tui.monitor.app import GputopApp

    feed = ReplayFeed(lambda frame: None, snapshots, own_pid=replay.own_pid)
    app = GputopApp(interval=replay.interval, replay=feed)
    code = app.run()
    for line in replay.problems:
        print(f"gputop: replay: {line}", file=sys.stderr)
    if replay.count > MAX_REPLAY_SAMPLES:
        print(f"gputop: replay: showed the first {MAX_REPLAY_SAMPLES} of {replay.count} samples",
              file=sys.stderr)
    if app.error:
        print(f"gputop: error: the replay stopped: {app.error}", file=sys.stderr)
        code = 1
    return int(code or 0)
