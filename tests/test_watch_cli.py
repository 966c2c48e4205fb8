"""`gputop watch` end to end on each demo scenario (acceptance of the live diagnosis)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

from tests.conftest import REPO, cli_env

EXPECTED = {
    "input-starved": "dataloader-stall",
    "host-sync": "host-sync",
    "throttled": "throttling",
    "memory-leak": "memory-growth",
    "pcie-bound": "pcie-bound",
    "gpu-lost": "hardware-errors",
}
HEALTHY_S = 40  # the acceptance runs 60 s by hand; 40 s keeps CI short and still covers every window


class Watch:
    """A `gputop watch --json` process whose lines are collected with their arrival times."""

    def __init__(self, scenario: str, duration: float) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gputop", "--demo", scenario, "watch", "--json",
             "--duration", str(duration)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=REPO,
        )
        self.events: list[tuple[float, dict]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.append((time.monotonic() - self.started, json.loads(line)))

    def first(self, finding_id: str) -> float | None:
        return next((t for t, e in self.events if e["id"] == finding_id and e["state"] == "raised"), None)


def test_each_scenario_raises_its_finding_within_20_s_and_healthy_raises_nothing():
    watches = {name: Watch(name, 30) for name in EXPECTED}
    healthy = Watch("healthy", HEALTHY_S)
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline and not all(w.first(EXPECTED[n]) for n, w in watches.items()):
        time.sleep(0.2)
    for watch in watches.values():
        watch.proc.send_signal(signal.SIGINT)  # Ctrl-C: exits 130
    for name, watch in watches.items():
        assert watch.proc.wait(10) == 130, (name, watch.proc.stderr.read())
        watch.reader.join(5)
        at = watch.first(EXPECTED[name])
        assert at is not None, (name, [e["id"] for _, e in watch.events])
        assert at <= 20, (name, at)
        event = next(e for _, e in watch.events if e["id"] == EXPECTED[name])
        assert set(event) >= {"time", "host", "gpu", "pid", "id", "severity", "evidence", "fix",
                              "state"}
        assert event["evidence"] and event["fix"]
    assert healthy.proc.wait(HEALTHY_S + 15) == 0
    healthy.reader.join(5)
    assert healthy.events == []
    assert "Traceback" not in healthy.proc.stderr.read()


def test_human_output_and_bad_duration():
    result = subprocess.run([sys.executable, "-m", "gputop", "--demo", "gpu-lost", "watch",
                             "--duration", "13"], capture_output=True, text=True, env=cli_env(),
                            cwd=REPO, timeout=60)
    assert result.returncode == 0
    assert "RAISED" in result.stdout and "hardware-errors" in result.stdout
    assert "fix:" in result.stdout
    bad = subprocess.run([sys.executable, "-m", "gputop", "watch", "--duration", "-1"],
                         capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=30)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
