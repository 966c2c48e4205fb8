"""The analysis on traces captured here and now from real CPU training loops (torch.profiler).

A DataLoader with num_workers=0 and a costly __getitem__ must come out as ``dataloader-stall``;
the same loop fed from memory must not. Two real gloo ranks, one doing extra work per step,
must come out as an ``imbalance`` on the slow rank. CPU-only traces have no GPU activity, so
the analysis must also say that GPU metrics could not be assessed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gputop.diagnostics.trace.analysis import analyze_trace, compare_ranks
from tests.conftest import SLOW, cli_env, run_cli

pytest.importorskip("torch")

TRAIN_LOOP = textwrap.dedent(
    """
    import sys
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)
    torch.manual_seed(0)


    class DecodedImages(Dataset):
        # Real per-sample CPU work, as image decoding and augmentation would do.
        def __len__(self):
            return 100_000

        def __getitem__(self, i):
            img = torch.rand(3, 96, 96, generator=torch.Generator().manual_seed(i))
            for _ in range(3):
                img = torch.fft.irfft2(torch.fft.rfft2(img) * 0.9, s=img.shape[-2:])
            return img.flatten()[:512], i % 10


    class BatchesInMemory(Dataset):
        # Whole batches prepared up front: fetching one costs next to nothing.
        def __init__(self):
            self.x = torch.rand(16, 64, 512)
            self.y = torch.randint(0, 10, (16, 64))

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], self.y[i]


    def train(loader, on_trace_ready=None, steps=6, use_schedule=True):
        # Tens of milliseconds of compute per step, so a scheduler hiccup while fetching a
        # batch from memory stays far below the 5% threshold on a busy machine.
        model = torch.nn.Sequential(
            torch.nn.Linear(512, 2048), torch.nn.ReLU(),
            torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
            torch.nn.Linear(2048, 10),
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        kwargs = dict(activities=[ProfilerActivity.CPU], on_trace_ready=on_trace_ready)
        if use_schedule:
            kwargs["schedule"] = schedule(wait=1, warmup=1, active=steps - 2, repeat=1)
        with profile(**kwargs) as prof:
            for step, (x, y) in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if use_schedule:
                    prof.step()
                if step + 1 >= steps:
                    break
        return prof


    out = sys.argv[1]
    slow = DataLoader(DecodedImages(), batch_size=64, num_workers=0)
    fast = DataLoader(BatchesInMemory(), batch_size=None, num_workers=0)
    train(slow, tensorboard_trace_handler(out + "/slow", use_gzip=True))
    train(fast, tensorboard_trace_handler(out + "/fast"))
    # No schedule and no prof.step(): a plain export_chrome_trace of a few iterations.
    train(fast, use_schedule=False, steps=5).export_chrome_trace(out + "/plain.json")
    """
)

RANK = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.rand(64, 256), torch.randint(0, 10, (64,))
    extra = torch.rand(384, 384)
    with profile(
        activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=5, repeat=1)
    ) as prof:
        for _ in range(7):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            if rank == 1:  # the straggler: more work per step than rank 0
                for _ in range(20):
                    extra @ extra
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            prof.step()
    prof.export_chrome_trace(out)
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("captured")
    script = out / "train_loop.py"
    script.write_text(TRAIN_LOOP)
    proc = subprocess.run(
        [sys.executable, str(script), str(out)],
        capture_output=True,
        text=True,
        timeout=2 * SLOW,
        env=cli_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    slow = list((out / "slow").glob("*.pt.trace.json.gz"))
    fast = list((out / "fast").glob("*.pt.trace.json"))
    assert len(slow) == 1 and len(fast) == 1, list(out.rglob("*"))
    return {"slow": slow[0], "fast": fast[0], "plain": out / "plain.json"}


def ids(analysis) -> list[str]:
    return [f.id for f in analysis.findings]


def test_slow_loader_with_num_workers_0_is_a_dataloader_stall(captured):
    a = analyze_trace(captured["slow"])
    assert a.verdict == "dataloader-stall", (a.findings, a.metrics["step_breakdown"])
    dl = a.metrics["dataloader"]
    assert dl["single_process"] and dl["share_pct"] >= 25
    finding = a.findings[0]
    assert finding.severity == "critical"
    assert "num_workers=0" in finding.evidence and "num_workers" in finding.fix
    # CPU-only: the DataLoader share is the step time spent in __next__, and GPU metrics are
    # reported as not assessed.
    assert a.metrics["trace"]["gpu_activity"] is False
    assert any("GPU metrics" in note for note in a.not_assessed)


def test_same_loop_with_fast_data_is_not_a_dataloader_stall(captured):
    a = analyze_trace(captured["fast"])
    assert "dataloader-stall" not in ids(a)
    assert a.metrics["dataloader"]["calls"] == 4  # the four active steps each fetched a batch
    assert a.metrics["dataloader"]["share_pct"] < 5
    assert any("GPU metrics" in note for note in a.not_assessed)
    if a.verdict == "healthy":
        assert "CPU compute busy" in a.healthy_reason


def test_cli_on_captured_traces(captured):
    proc = run_cli("analyze", "--json", str(captured["slow"]), str(captured["fast"]))
    assert proc.returncode == 0, proc.stderr
    slow, fast = (json.loads(line) for line in proc.stdout.splitlines())
    assert slow["verdict"] == "dataloader-stall"
    assert "dataloader-stall" not in [f["id"] for f in fast["findings"]]
    report = run_cli("analyze", str(captured["slow"]))
    assert report.returncode == 0 and "D idle: DataLoader" in report.stdout


def test_trace_without_profiler_steps_uses_optimizer_iterations(captured):
    a = analyze_trace(captured["plain"])
    assert a.metrics["window"]["steps_from"] == "Optimizer.step"
    # 5 optimizer steps delimit 4 whole iterations; what came before the first optimizer step
    # is an unknown part of one and is left out.
    assert a.metrics["steps"]["count"] == 4
    assert any("Optimizer.step" in note for note in a.not_assessed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(5 * SLOW)  # two torch processes, then the analysis: slow on a busy machine
def test_straggler_rank_is_an_imbalance(tmp_path, spawn):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port = str(free_port())
    traces = [tmp_path / f"rank{r}.json" for r in (0, 1)]
    procs = [
        spawn(
            [sys.executable, str(script), str(r), port, str(traces[r])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        for r in (0, 1)
    ]
    for p in procs:
        _, err = p.communicate(timeout=2 * SLOW)
        assert p.returncode == 0, err[-3000:]

    alone = [analyze_trace(t) for t in traces]
    assert all("imbalance" not in ids(a) for a in alone)  # one rank alone shows no straggler
    found = compare_ranks(alone)
    assert [f.id for f in found] == ["imbalance"]
    assert found[0].title.startswith("rank 1 ")

    proc = run_cli("analyze", "--json", *map(str, traces))
    assert proc.returncode == 0, proc.stderr
    r0, r1 = (json.loads(line) for line in proc.stdout.splitlines())
    assert "imbalance" in [f["id"] for f in r1["findings"]]
    assert "imbalance" not in [f["id"] for f in r0["findings"]]
    # Rank 0 spends its steps waiting for rank 1 inside the collectives.
    assert "communication" in [f["id"] for f in r0["findings"]]
