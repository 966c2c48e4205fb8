"""`gputop record`: sample GPUs, host, training processes and findings into Parquet."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from gputop.core.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "record",
        parents=[common],
        help="record a long run to Parquet (crash-safe parts)",
        description="Record GPUs, host, training processes (with agent telemetry) and the findings "
        "of the live rules into PATH, a directory of Parquet parts that "
        "pandas.read_parquet(PATH) reads as one row per GPU per sample. Parts are flushed every "
        "--flush-every seconds, so a killed recorder keeps everything up to the last flush.",
    )
    p.add_argument("-o", "--output", required=True, metavar="PATH", help="recording to create")
    p.add_argument("--duration", type=float, metavar="S", default=None,
                   help="stop after S seconds (default: until Ctrl-C or SIGTERM)")
    p.add_argument("--flush-every", type=float, metavar="S", default=30.0,
                   help="write a part at least this often (default 30 s)")


def progress(samples: int, started: float, duration: float | None, output: str) -> None:
    """On a terminal, one line on stderr kept up to date: samples so far and time left."""
    if not sys.stderr.isatty():
        return
    elapsed = time.monotonic() - started
    left = f", {max(0.0, duration - elapsed):.0f} s left" if duration else ", Ctrl-C to stop"
    print(f"\r\033[Kgputop: recording to {output}: {samples} samples, {elapsed:.0f} s{left}",
          end="", file=sys.stderr, flush=True)


def progress_done() -> None:
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    # Imported here: every command module is loaded to build --help, so keep those light.
    from gputop.client.session import open_sampler, sample_every
    from gputop.diagnostics.live.mig import LiveDiagnosis  # MIG devices one by one
    from gputop.recording.store import Recorder, RecordingError, recording_meta

    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be positive")
    if not 0.5 <= args.flush_every <= 60:
        raise UsageError("--flush-every must be between 0.5 and 60 seconds")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    recorder = Recorder(Path(args.output), flush_every=args.flush_every)
    diagnosis = LiveDiagnosis()
    samples = 0
    started = time.monotonic()
    try:
        with open_sampler(args.demo, args.gpus, args.seed) as sampler:
            if not sampler.driver.available:
                print(f"gputop: {sampler.driver.error}; recording the host and agent "
                      "telemetry only", file=sys.stderr)
            host = sampler.host.hostname
            try:
                for snap in sample_every(sampler, args.interval, args.duration):
                    if samples == 0:
                        recorder.create(recording_meta(snap, args.interval))
                    events = [t.to_json(host) for t in diagnosis.update(snap)]
                    recorder.add(snap, events)
                    samples += 1
                    progress(samples, started, args.duration, args.output)
            except KeyboardInterrupt:
                pass
            progress_done()
            recorder.flush()
    except RecordingError as exc:
        raise UsageError(str(exc), exit_code=1) from None
    print(f"gputop: recorded {samples} samples to {args.output}", file=sys.stderr)
    return 0
