"""`gputop top` (and `gputop` alone): the live monitor."""

from __future__ import annotations

import argparse
import gc
import os
import sys

from gputop.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "top",
        parents=[common],
        help="the live monitor (the default command)",
        description="Live GPUs, host and training processes with their DataLoader workers, "
        "and the findings of the live rules. Keys: q quit, space pause, 1-4 chart window, "
        "c compact, s/S sort, / filter, t tree, Enter process view, k signal (asks first), "
        "p capture 3 steps and diagnose them (with the gputop agent; on a rank of a job, every "
        "rank at the same steps; without the agent, the process's Python stacks sampled with "
        "py-spy), ? help. "
        "With --hosts/--hostfile/--slurm: every node over ssh on one screen (Enter: a node's "
        "screen, p: capture on the node, r: retry a node now). Respects NO_COLOR.",
    )
    p.add_argument(
        "--auto-capture",
        action="store_true",
        help="when a stall finding (dataloader-stall, host-sync, launch-bound, gpu-idle, "
        "pcie-bound) raises on a process with the gputop agent, capture it by itself (at most "
        "once per 10 minutes per process) and show the verdict and trace under the finding; "
        "on a process without the agent, sample its Python stacks (py-spy) and show where it "
        "is instead",
    )


def run(args: argparse.Namespace) -> int:
    from gputop.fleet.cli import fleet_requested, run_fleet_top

    if fleet_requested(args):  # --hosts, --hostfile, --slurm: the fleet screen
        return run_fleet_top(args)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError(
            "the live monitor needs a terminal; for text output use `gputop snapshot`"
        )
    from gputop.tui.early_start import EarlySampler

    # No cyclic garbage collection until the first frames are drawn (the app collects once
    # and turns it back on then, freeze_startup_objects): importing and building the
    # interface allocates ~100 000 objects, and the collector walked them over and over on
    # the way, ~10 % of the CPU to the first frame.
    gc.disable()
    # The driver opens (and a demo starts) while the interface is imported and built.
    early = EarlySampler(args.demo, args.gpus, args.seed).start()
    from gputop.tui.app import GputopApp

    app = GputopApp(demo=args.demo, gpus=args.gpus, interval=args.interval, seed=args.seed,
                    auto_capture=getattr(args, "auto_capture", False), early=early)
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
