"""Labelled recordings replayed through the live rules, and scored.

A label says what a right live diagnosis raises for a recorded job: one of ``expect`` at warning
or worse (none for a healthy job), possibly ``allow`` beside it. Anything else raised at warning
or worse is a false alarm, and so is any finding raised before the job's first step (no cause
is right during start-up). Labels come from a ``labels.tsv`` beside the recordings (recording,
expect, allow, source) or, for ``../shared/realgpu``, from its README's table. Used by
``benchmarks/bench_live_accuracy.py`` and the tests.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

from gputop.core.model import Snapshot
from gputop.diagnostics.findings import CATALOGUE, SEVERITY_RANK
from gputop.diagnostics.live import Transition
from gputop.diagnostics.live.common import WORKED_UTIL, agent_steps
from gputop.diagnostics.live.mig import LiveDiagnosis  # MIG devices one by one, as live
from gputop.recording.replay import open_replay


@dataclass(frozen=True)
class Label:
    name: str
    path: Path
    expect: tuple[str, ...]  # one of these must raise; () for a healthy job
    allow: tuple[str, ...] = ()
    source: str = ""


def read_labels_tsv(folder: Path) -> list[Label]:
    """``folder/labels.tsv``: recording, expect (ids, or ``healthy``), allow, source."""
    path = folder / "labels.tsv"
    if not path.is_file():
        return []
    labels = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            expect = tuple(i for i in (row.get("expect") or "").split(",") if i in CATALOGUE)
            allow = tuple(i for i in (row.get("allow") or "").split(",") if i in CATALOGUE)
            name = (row.get("recording") or "").strip()
            if name and (folder / name).is_dir():
                labels.append(Label(name, folder / name, expect, allow, row.get("source") or ""))
    return labels


def read_readme_table(folder: Path) -> list[Label]:
    """The table of ``folder/README.md`` (``../shared/realgpu``): | `name/` | the job | what a
    right live diagnosis says |, the ids in backquotes; "no cause ..." means healthy, the ids
    it names allowed."""
    path = folder / "README.md"
    if not path.is_file():
        return []
    labels = []
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3:
            continue
        name = cells[0].strip("`").rstrip("/")
        if not name or not (folder / name).is_dir():
            continue
        ids = tuple(i for i in re.findall(r"`([a-z-]+)`", cells[-1]) if i in CATALOGUE)
        if cells[-1].lower().startswith("no cause"):
            labels.append(Label(name, folder / name, (), ids, cells[1]))
        elif ids:
            labels.append(Label(name, folder / name, ids, (), cells[1]))
    return labels


def find_labelled(folders: list[Path]) -> list[Label]:
    found: list[Label] = []
    for folder in folders:
        found.extend(read_labels_tsv(folder) or read_readme_table(folder))
    return found


@dataclass
class Outcome:
    label: Label
    raised: list[Transition] = field(default_factory=list)
    first_step: float | None = None  # when start-up ended (first step, else first GPU work)
    samples: int = 0

    @property
    def actionable(self) -> list[str]:
        """Ids raised at warning or worse, in order, once each."""
        ids: list[str] = []
        for t in self.raised:
            if SEVERITY_RANK[t.finding.severity] >= SEVERITY_RANK["warning"]:
                if t.finding.id not in ids:
                    ids.append(t.finding.id)
        return ids

    @property
    def right(self) -> bool:
        ids = set(self.actionable)
        if not self.label.expect:
            return ids <= set(self.label.allow)
        return bool(ids & set(self.label.expect))

    @property
    def false_alarms(self) -> list[str]:
        ok = set(self.label.expect) | set(self.label.allow)
        out = [i for i in self.actionable if i not in ok]
        if self.first_step is not None:
            out += [f"{t.finding.id} in start-up" for t in self.raised
                    if t.time < self.first_step]
        return out


def _started(snap: Snapshot) -> bool:
    """Whether a job on a GPU of ``snap`` has stepped (agent) or its GPU has worked."""
    for gpu in snap.gpus:
        for proc in gpu.processes:
            steps = agent_steps(proc)
            if steps is not None:
                if steps > 0:
                    return True
            elif (gpu.util_gpu or 0) >= WORKED_UTIL:
                return True
    return False


def score(label: Label) -> Outcome:
    """Replay ``label``'s recording through the live rules (as `gputop replay` does)."""
    replay = open_replay(label.path)
    diagnosis = LiveDiagnosis(own_pid=replay.own_pid)
    outcome = Outcome(label)
    for snap in replay.snapshots():
        outcome.samples += 1
        if outcome.first_step is None and _started(snap):
            outcome.first_step = snap.time
        outcome.raised.extend(t for t in diagnosis.update(snap) if t.state == "raised")
    return outcome
