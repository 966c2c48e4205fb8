"""Step telemetry in this very process: a real agent, real optimizers, a real DataLoader."""

from __future__ import annotations

import faulthandler
import json
import os
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import gputop.agent
from gputop.client import agents as client
from tests.conftest import SLOW
from tests.scripts.agent_testkit import ANSWER_S


@pytest.fixture
def agent(tmp_path, monkeypatch):
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("GPUTOP_CAPTURE_DIR", str(tmp_path / "captures"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # OpenMP barriers stall for ms on a loaded 2-core machine
    path = gputop.agent.install()
    assert path is not None and path.exists()
    try:
        yield path
    finally:
        gputop.agent.shutdown()
        torch.set_num_threads(threads)
    assert not path.exists()


def status() -> dict:
    return client.request(os.getpid(), {"cmd": "status"}, timeout=ANSWER_S)


class SleepyDataset(Dataset):
    def __init__(self, item_s: float) -> None:
        self.item_s = item_s

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        time.sleep(self.item_s)
        return torch.full((8,), float(i)), i % 2


def train(loader, optimizers, model, iterations: int) -> None:
    batches = iter(loader)
    for _ in range(iterations):
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        for opt in optimizers:
            opt.step()


def test_install_is_idempotent(agent):
    assert gputop.agent.install() == agent
    assert client.list_agents()[os.getpid()] == agent


def test_two_optimizers_count_one_step_per_iteration(agent):
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    optimizers = [
        torch.optim.SGD(model[0].parameters(), lr=0.1),
        torch.optim.Adam(model[1].parameters(), lr=0.01),
    ]
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=4)
    train(loader, optimizers, model, 10)
    assert status()["steps"] == 10


def test_a_replaced_optimizer_takes_over_counting(agent):
    model = nn.Linear(8, 2)
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=4)
    first = torch.optim.SGD(model.parameters(), lr=0.1)
    train(loader, [first], model, 5)
    assert status()["steps"] == 5
    # A second optimizer while the first still exists: it leads after 4 steps in a row.
    second = torch.optim.SGD(model.parameters(), lr=0.01)
    train(loader, [second], model, 10)
    assert status()["steps"] == 5 + 10 - 3
    # The leader is freed (replaced for good): the next optimizer counts from its first step.
    del second
    train(loader, [torch.optim.SGD(model.parameters(), lr=0.01)], model, 4)
    assert status()["steps"] == 12 + 4
    del first


def test_dataloader_wait_share_tells_slow_from_fast_input(agent):
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fast = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    train(DataLoader(fast, batch_size=4), [opt], model, 3)  # torch's first-call costs
    gputop.agent.shutdown()
    gputop.agent.install()
    train(DataLoader(SleepyDataset(0.008), batch_size=4), [opt], model, 8)
    slow = status()
    assert slow["dataloader_wait_share"] > 0.8, list(gputop.agent._agent.telemetry._ring)
    assert slow["step_time_p50_s"] >= 0.032  # 4 items x 8 ms
    gputop.agent.shutdown()
    gputop.agent.install()
    big = nn.Sequential(nn.Linear(8, 512), nn.ReLU(), nn.Linear(512, 512), nn.Linear(512, 2))
    train(DataLoader(fast, batch_size=4), [torch.optim.SGD(big.parameters(), lr=0.1)], big, 8)
    assert status()["dataloader_wait_share"] < 0.5


def test_an_agent_failure_never_reaches_the_training_loop(agent):
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=4)

    def broken(_now: float) -> None:
        raise RuntimeError("boom")

    telemetry = gputop.agent._agent.telemetry
    telemetry.on_step = broken  # as if a capture's step handler failed
    train(loader, [opt], model, 3)  # must not raise
    reply = status()
    assert reply["steps"] == 3 and reply["agent_errors"] == 3
    assert reply["last_agent_error"] == "RuntimeError: boom"


def test_a_forked_child_drops_the_server_and_serves_only_if_it_trains(agent):
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        faulthandler.dump_traceback_later(SLOW, exit=True)  # a hang fails instead of stalling
        code = 1
        try:
            # (torch's OpenMP pool does not survive fork: a forked child that trains must go
            # single-threaded, as DataLoader workers do, or it can hang in its first op)
            torch.set_num_threads(1)
            report = {
                "socket_after_fork": str(gputop.agent.socket_path()),
                "parent_socket_kept": agent.exists(),
            }
            train(
                DataLoader(
                    TensorDataset(torch.randn(8, 8), torch.randint(0, 2, (8,))), batch_size=4
                ),
                [opt],
                model,
                1,
            )
            mine = gputop.agent.socket_path()
            report["socket_after_step"] = str(mine)
            report["hello"] = client.request(os.getpid(), {"cmd": "hello"},
                                             timeout=ANSWER_S)["pid"]
            os.write(write_end, json.dumps(report).encode())
            gputop.agent.shutdown()
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        report = json.loads(f.read())
    _, wait_status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert report["socket_after_fork"] == "None"
    assert report["parent_socket_kept"] is True
    assert report["socket_after_step"].endswith(f"/{child}.sock")
    assert report["hello"] == child
    assert agent.exists()
    assert client.request(os.getpid(), {"cmd": "hello"}, timeout=ANSWER_S)["pid"] == os.getpid()


def test_the_step_rate_of_a_fast_job_is_its_rate_not_the_ring_over_the_window(agent):
    """On an H200 a ResNet-18 ran 120 steps/s; the status said 49 steps/s, because 512 kept
    steps were divided by the 30 s window. The rate must match the steps counted."""
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 4)
    start_steps = status()["steps"]
    start = time.perf_counter()
    while time.perf_counter() - start < 3.0 or status()["steps"] - start_steps < 1200:
        for _ in range(100):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    # Two status reads around a timed second give the true rate.
    before, t0 = status()["steps"], time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    report = status()
    true_rate = (report["steps"] - before) / (time.perf_counter() - t0)
    assert report["steps_per_s"] == pytest.approx(true_rate, rel=0.35), (report, true_rate)


def test_the_step_breakdown_tells_busy_python_from_a_sleeping_loop(agent):
    """host_busy_share is the training thread's CPU time on its own code, outside the
    DataLoader and device syncs, between two status requests: a loop that computes in Python
    reads high, one that sleeps between steps reads low, and neither has DataLoader or sync
    time."""
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))

    def loop(between) -> dict:
        gputop.agent.shutdown()
        gputop.agent.install()

        def step() -> None:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            between()

        for _ in range(3):
            step()
        assert status()["host_busy_share"] is None  # no earlier request to compare with yet
        start = time.monotonic()
        while time.monotonic() - start < 1.0:
            step()
        return status()

    def python_work() -> None:  # 20 ms of CPU time in Python: bookkeeping
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass

    busy = loop(python_work)
    sleepy = loop(lambda: time.sleep(0.02))
    # On an idle core the busy loop reads ~1 and the sleepy one far less. A busy host gives
    # both a share f of a core: the busy step's 20 ms of CPU stretch to 20/f ms, so it reads
    # ~f, and the sleepy one's own CPU work stretches too while its sleep does not, so it
    # reads less than f. Neither absolute share nor their ratio is ours to assert; their
    # order is.
    assert busy["host_busy_share"] > 0, busy
    assert sleepy["host_busy_share"] < busy["host_busy_share"], (busy, sleepy)
    for reply in (busy, sleepy):
        assert reply["sync_wait_share"] == 0.0 and reply["dataloader_wait_share"] == 0.0


def test_syncs_on_cpu_tensors_are_not_counted_and_the_wrappers_come_off(agent):
    """The sync wrappers time only CUDA tensors (on a CPU tensor .item() waits on nothing),
    keep what the calls return, and are removed with the agent."""
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    assert getattr(torch.Tensor.item, "_gputop_original", None) is not None
    for _ in range(6):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.detach()
        assert isinstance(value.item(), float) and bool(value > -1)
        assert float(value) == value.item() and value.tolist() == value.item()
    assert status()["sync_wait_share"] == 0.0
    gputop.agent.shutdown()
    assert "item" not in vars(torch.Tensor)  # inherited from TensorBase again
    assert getattr(torch.cuda.synchronize, "_gputop_original", None) is None
    gputop.agent.install()

