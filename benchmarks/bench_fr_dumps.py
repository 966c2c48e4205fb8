"""Flight Recorder dumps: how fast `gputop analyze` reads and attributes them, and refuses bad ones.

    python benchmarks/bench_fr_dumps.py [--ranks 16 128] [--entries 2000]

Builds, from the real 4-rank gloo dump in tests/data/fr (its records' fields and frames), one
job per rank count: every rank a full ring buffer of ``--entries`` records over three groups
(tensor, data, world), one rank stopped before its data-parallel all_reduce; writes the dumps
(pickle, as PyTorch does) to a temporary folder and prints, per job: the dumps' size, the time
`gputop analyze --json DIR` takes (a fresh process, as a user runs it), the time to read them
in this process and to attribute them, and whether the stopped rank was named. Then the time to
refuse a 1 GiB dump (size bound), a pickle that would run os.system, and a truncated dump.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
REAL = REPO / "tests" / "data" / "fr" / "gloo_multipg_rank_0"


def job(ranks: int, entries: int, stop: int) -> dict[int, dict]:
    """Raw dumps (as PyTorch's pickle holds them) of a job whose rank ``stop`` never reaches its
    data-parallel all_reduce of the last step."""
    template = pickle.loads(REAL.read_bytes())  # our own committed test data
    proto = next(e for e in template["entries"] if e["process_group"][1] == "DATA_PARALLEL_GROUP")
    tp = 4
    steps = entries // 3
    out = {}
    t0 = time.time_ns() - steps * 10**9
    for r in range(ranks):
        groups = [("0", "default_pg", 0), (str(1 + r // tp), "TENSOR_PARALLEL_GROUP", 1),
                  (str(1 + ranks // tp + r % tp), "DATA_PARALLEL_GROUP", 2)]
        stopped = str(1 + ranks // tp + stop % tp)
        recs = []
        for s in range(1, steps + 1):
            for i, (name, desc, idx) in enumerate(groups[1:] + groups[:1]):
                last = s == steps
                if r == stop and last and i == 1:
                    break
                waits = last and (i == 2 or (i == 1 and name == stopped))
                recs.append(dict(proto, process_group=(name, desc), pg_id=idx,
                                 collective_seq_id=s, retired=not waits,
                                 record_id=len(recs), time_created_ns=t0 + s * 10**9 + i))
                if waits:
                    break
            else:
                continue
            break
        out[r] = dict(template, entries=recs[-entries:], pg_status={}, pg_config={})
    return out


def timed(fn, *args, **kw):
    t = time.perf_counter()
    value = fn(*args, **kw)
    return value, time.perf_counter() - t


def read_all(folder: Path, read_dump) -> dict:
    paths = sorted(folder.iterdir(), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    return {r: read_dump(str(p)) for r, p in enumerate(paths)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--entries", type=int, default=2000)
    args = ap.parse_args()
    from gputop.diagnostics.hang import attribute, read_dump

    env = dict(os.environ, PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            folder = Path(tmp) / f"job{n}"
            folder.mkdir()
            stop = n - 5
            for r, raw in job(n, args.entries, stop).items():
                (folder / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(raw))
            size = sum(p.stat().st_size for p in folder.iterdir())
            out, cli_s = timed(
                subprocess.run, [sys.executable, "-m", "gputop", "analyze", "--json", str(folder)],
                capture_output=True, text=True, env=env, cwd=REPO)
            report = json.loads(out.stdout) if out.returncode == 0 else {}
            first = (report.get("findings") or [{}])[0]
            dumps, read_s = timed(read_all, folder, read_dump)
            _, attr_s = timed(attribute, dumps)
            print(f"{n:4d} ranks x {args.entries} entries: {size / 2**20:6.1f} MiB of dumps; "
                  f"`gputop analyze --json` {cli_s:5.2f} s (rc {out.returncode}); read "
                  f"{read_s:5.2f} s, attribute {attr_s:5.2f} s; named {first.get('ranks')} "
                  f"(expected [{stop}]) in {first.get('process_group', {}).get('desc')} "
                  f"#{first.get('seq')}", flush=True)
        bad = Path(tmp) / "bad"
        bad.mkdir()
        big = bad / "fr_trace_rank_0"
        with big.open("wb") as fh:
            fh.write(REAL.read_bytes())
            fh.truncate(2**30)
        evil = bad / "evil_rank_1"

        class Evil:
            def __reduce__(self):
                return (os.system, (f"touch {bad}/pwned",))

        evil.write_bytes(pickle.dumps(Evil()))
        cut = bad / "cut_rank_2"
        data = REAL.read_bytes()
        cut.write_bytes(data[: len(data) // 2])
        for path in (big, evil, cut):
            out, s = timed(subprocess.run, [sys.executable, "-m", "gputop", "analyze", str(path)],
                           capture_output=True, text=True, env=env, cwd=REPO)
            print(f"{path.name}: rc {out.returncode} in {s:.2f} s (a fresh process): "
                  f"{out.stderr.strip()[:160]}")
        print(f"the hostile pickle's file exists: {(bad / 'pwned').exists()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
