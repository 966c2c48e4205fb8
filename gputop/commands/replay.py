"""`gputop replay`: run the live rules over a recording and print their findings as `watch`
does, on the recording's own clock."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gputop.core.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "replay",
        parents=[common],
        help="run the live rules over a recording; print findings as `watch` does",
        description="Feed every sample of a `gputop record` directory, in order and on its "
        "own clock, through the same live rules, windows and hysteresis as `gputop watch`, "
        "and print each finding as it raises and clears, in `watch`'s format. Recordings "
        "made before gputop kept whole samples are rebuilt from their tables; what they lack "
        "(the PCIe link, process states, the agent's sync timing) is listed on stderr with "
        "what it leaves unassessed. `gputop top --replay DIR` shows a recording on screen.",
    )
    p.add_argument("recording", metavar="DIR", help="a recording made by `gputop record`")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line, as `watch --json` prints: time (the "
                        "recording's), host, gpu, pid, job, rank, id, severity, title, "
                        "evidence, fix, next_step, state (raised | cleared); fields in "
                        "docs/watch.md")


def run(args: argparse.Namespace) -> int:
    # Imported here (pandas, pyarrow): every command module is loaded to build --help.
    from gputop.diagnostics.live.coverage import Coverage
    from gputop.diagnostics.live.lines import transition_line
    from gputop.diagnostics.live.mig import LiveDiagnosis  # MIG devices one by one
    from gputop.recording.replay import open_replay
    from gputop.recording.store import RecordingError

    try:
        replay = open_replay(Path(args.recording))
        diagnosis = LiveDiagnosis(own_pid=replay.own_pid)
        coverage = Coverage()
        samples = raised = 0
        for snap in replay.snapshots():
            samples += 1
            coverage.add(snap)
            for transition in diagnosis.update(snap):
                raised += transition.state == "raised"
                print(transition_line(transition, replay.host, args.json), flush=True)
    except RecordingError as exc:
        raise UsageError(str(exc), exit_code=1) from None
    if not samples:
        raise UsageError(f"{args.recording} holds no sample that could be replayed"
                         + (f": {replay.problems[0]}" if replay.problems else ""), exit_code=1)
    source = ("whole samples" if replay.source == "snapshots"
              else f"samples rebuilt from its tables ({replay.tables_why})")
    print(f"gputop replay: {samples} {source}, {raised} finding(s) raised", file=sys.stderr)
    from gputop.core.format import safe_text  # a skipped part's reason can quote its bytes

    problems = [p for p in replay.problems if replay.tables_why not in p]  # said above
    for line in [*problems, *coverage.notes()]:
        print(safe_text(f"gputop replay: {line}"), file=sys.stderr)
    return 0
