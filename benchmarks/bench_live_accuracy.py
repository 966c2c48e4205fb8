"""Accuracy of the live rules on labelled recordings of real GPU jobs, replayed.

Every labelled recording found is replayed through the live rules exactly as `gputop replay`
does (same rules, windows and hysteresis, on the recording's clock), and scored against its
label (``gputop/recording/accuracy.py``):

- right: one of the expected causes is raised at warning or worse (a healthy job: nothing but
  what its label allows);
- wrong: it is not;
- false alarm: any other id raised at warning or worse, or any finding raised before the job's
  first step (no cause is right during start-up).

Where it looks: the project's own labelled recordings (``tests/data/realgpu``, ``labels.tsv``),
``../shared/realgpu`` (its README's table), and any folder given on the command line (with a
``labels.tsv``, or a README table of that form).

    python benchmarks/bench_live_accuracy.py [FOLDER ...]

Prints one line per recording and the totals; exit status 0 when every recording is right with
no false alarm, 1 otherwise, 2 when no labelled recording is found.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gputop.recording.accuracy import find_labelled, score  # noqa: E402

FOLDERS = (REPO / "tests" / "data" / "realgpu", REPO.parent / "shared" / "realgpu")


def shown(path: Path) -> str:
    """The recording's path as a reader finds it from the repository's root."""
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        try:
            return str(Path("..") / path.relative_to(REPO.parent))
        except ValueError:
            return str(path)


def main(argv: list[str]) -> int:
    folders = [*FOLDERS, *(Path(a) for a in argv)]
    labels = find_labelled([f for f in folders if f.is_dir()])
    if not labels:
        print("no labelled recording found in: " + ", ".join(str(f) for f in folders))
        return 2
    right = wrong = alarms = samples = 0
    started = time.perf_counter()
    width = max(len(shown(label.path)) for label in labels)
    print(f"{'recording':<{width}}  {'expected':<30} {'raised (warning+)':<30} verdict  false alarms")
    for label in labels:
        outcome = score(label)
        samples += outcome.samples
        ok = outcome.right
        right += ok
        wrong += not ok
        alarms += len(outcome.false_alarms)
        expected = (" or ".join(label.expect) or "nothing") + (
            f" (may: {', '.join(label.allow)})" if label.allow else "")
        print(f"{shown(label.path):<{width}}  {expected:<30} "
              f"{', '.join(outcome.actionable) or '-':<30} {'right' if ok else 'WRONG':<8} "
              f"{', '.join(outcome.false_alarms) or '-'}")
    elapsed = time.perf_counter() - started
    print(f"\n{len(labels)} recordings ({samples} samples, replayed in {elapsed:.1f} s): "
          f"right {right}, wrong {wrong}, false alarms {alarms}")
    return 0 if wrong == 0 and alarms == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
