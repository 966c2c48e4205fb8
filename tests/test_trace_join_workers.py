"""A forked DataLoader worker's py-spy stack still holds its parent's frames down to the fork
(the training loop's `for batch in loader`): only the frames inside torch's `_worker_loop` are
the worker's own work. A worker waiting for its next index is not "time in your code", however
the machine's load stretches that wait (tests/test_capture_bounded.py runs the real job)."""

from __future__ import annotations

from gputop.stacks.profile import Frame
from gputop.stacks.timeline import Sample
from gputop.stacks.trace_join import _lines, _name, _worker_own

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
PARENT = (  # the parent's frames, copied by fork
    Frame("<module>", "/home/me/train.py", 140),
    Frame("main", "/home/me/train.py", 117),
    Frame("__next__", f"{SITE}/torch/utils/data/dataloader.py", 733),
    Frame("_try_get_data", f"{SITE}/torch/utils/data/dataloader.py", 1133),
    Frame("_launch", f"{STDLIB}/multiprocessing/popen_fork.py", 71),
    Frame("_bootstrap", f"{STDLIB}/multiprocessing/process.py", 314),
    Frame("_worker_loop", f"{SITE}/torch/utils/data/_utils/worker.py", 309),
)
WAITING = PARENT + (Frame("get", f"{STDLIB}/multiprocessing/queues.py", 113),
                    Frame("select", f"{STDLIB}/selectors.py", 415))
WORKING = PARENT + (Frame("fetch", f"{SITE}/torch/utils/data/_utils/fetch.py", 52),
                    Frame("__getitem__", "/home/me/train.py", 48))


def sample(frames: tuple[Frame, ...], t: float = 0.0) -> Sample:
    return Sample(t=t, dur=0.01, pid=2, tid=1, frames=frames)


def test_a_waiting_worker_has_no_user_frame_of_its_own():
    assert _name(WAITING)[0].function == "main"  # as py-spy gives it: the parent's frame
    assert _name(_worker_own(sample(WAITING)).frames) is None
    assert _name(_worker_own(sample(WORKING)).frames)[0].function == "__getitem__"


def test_workers_lines_name_getitem_even_when_they_mostly_wait():
    # 60 % of the workers' samples wait for an index (a loaded machine), 40 % run __getitem__.
    samples = [(_worker_own(sample(WAITING, i)), 0.6) for i in range(10)] + \
        [(_worker_own(sample(WORKING, i)), 0.4) for i in range(10)]
    weighted = [(s, sec) for s, sec in samples if _name(s.frames)]
    lines, _, _ = _lines(weighted, "DataLoader workers", sum(sec for _, sec in weighted))
    assert lines[0].frame.function == "__getitem__" and lines[0].share == 1.0
    # Without the loop's cut, the parent's `main` would be the workers' top line.
    uncut = [(sample(WAITING, i), 0.6) for i in range(10)] + \
        [(sample(WORKING, i), 0.4) for i in range(10)]
    lines, _, _ = _lines(uncut, "DataLoader workers", 10.0)
    assert lines[0].frame.function == "main"


def test_a_sample_outside_any_worker_loop_is_kept_whole():
    own = (Frame("main", "/home/me/train.py", 117),)
    assert _worker_own(sample(own)).frames == own
