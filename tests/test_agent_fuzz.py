"""10 000 random and malformed messages against the agent of a real training job."""

from __future__ import annotations

import json
import random
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputop.client import agents as client
from tests.conftest import SLOW
from tests.scripts.agent_testkit import (
    ANSWER_S,
    gputop_run,
    private_agent_world,
    running,
    train_cmd,
    wait_for_more_steps,
    wait_for_steps,
)

BATCHES = 100
BATCH = 100  # messages per connection: 100 x 100 = 10 000
DRAWN = 10  # of which hypothesis draws this many itself; the rest come from its Random

# Hypothesis drawing all 10 000 messages one by one takes minutes on a busy 2-core machine, so
# each batch mixes a few messages drawn by hypothesis with many made by a seeded
# random.Random that hypothesis hands us (reproducible, and cheap).

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=5,
)
drawn_lines = st.one_of(
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")),
    json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    st.fixed_dictionaries(
        {"cmd": st.sampled_from(["hello", "status", "cancel"])}, optional={"x": json_values}
    ).map(lambda d: json.dumps(d, allow_nan=True).encode()),
)

COMMANDS = [*client.COMMANDS, "", "HELLO", "capture ", "shutdown", "__init__", "eval"]
NASTY = [
    b"",
    b"{",
    b"}",
    b"null",
    b'"cmd"',
    b"[" * 5000,
    b'{"cmd": "hello"',
    b"\x00" * 64,
    b'{"cmd": "status", "cmd": 3}',
    b"1" * 5000,
    b"\xef\xbb\xbf{}",
    b"\r",
    b"\xff" * 9,
    b'{"cmd": "capture", "steps": 1e999}',
    b'{"cmd": "capture", "steps": NaN}',
    b'{"cmd": "capture", "out": "/tmp/x\\n"}',
    b'{"__proto__": {"cmd": "hello"}}',
]


def random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 1, 2**63, -(2**70), rng.randrange(-(10**6), 10**6)])
    if kind == 3:
        return rng.choice([0.5, -0.0, 1e308, float("nan"), float("inf"), rng.uniform(-1e6, 1e6)])
    if kind in (4, 5):
        return "".join(
            chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x2FFF)]))
            for _ in range(rng.randrange(12))
        )
    if kind in (6, 7):
        return {
            str(random_value(rng, 3)): random_value(rng, depth + 1) for _ in range(rng.randrange(4))
        }
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def random_message(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(200))).replace(b"\n", b" ")
    if kind == 1:
        return json.dumps(random_value(rng), allow_nan=True).encode()
    if kind == 2:
        return rng.choice(NASTY)
    message: dict = {"cmd": rng.choice(COMMANDS)}
    for _ in range(rng.randrange(3)):
        message[
            rng.choice(
                [
                    "steps",
                    "seconds",
                    "warmup",
                    "timeout",
                    "out",
                    "record_shapes",
                    "x",
                    str(random_value(rng, 3)),
                ]
            )
        ] = random_value(rng, 2)
    if message["cmd"] == "capture":
        # Always invalid: a valid capture would really profile the job.
        message["steps"] = rng.choice([0, -3, 1001, "3", 2.5, True, None, [3], {"n": 3}])
    data = json.dumps(message, allow_nan=True).encode()
    if kind == 4 and data:  # damage it: cut, flip a byte or splice in garbage
        i = rng.randrange(len(data))
        data = rng.choice(
            [
                data[:i],
                data[:i] + bytes([rng.randrange(256)]) + data[i + 1 :],
                data[:i] + rng.choice(NASTY) + data[i:],
            ]
        ).replace(b"\n", b" ")
    return data


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    captures = tmp_path_factory.mktemp("captures")
    with private_agent_world(captures) as (env, _runtime):
        proc = gputop_run(train_cmd("--steps", "0", "--item-ms", "2"), env)
        with running(proc):
            wait_for_steps(proc.pid, steps=2)
            yield proc


def exchange(path: str, lines: list[bytes]) -> list[dict]:
    """All lines over one connection; one reply per line, read back in order."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(SLOW)  # a hang fails the test instead of stalling it
        s.connect(path)
        s.sendall(b"".join(line + b"\n" for line in lines))
        data = b""
        while data.count(b"\n") < len(lines):
            chunk = s.recv(1 << 16)
            assert chunk, "the agent closed the connection"
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_random_and_malformed_messages_never_hurt_the_agent_or_the_training(job):
    path = str(client.find_agent(job.pid))
    sent: list[int] = []

    @settings(
        max_examples=BATCHES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.randoms(use_true_random=False), st.lists(drawn_lines, min_size=DRAWN, max_size=DRAWN))
    def one_connection(rng: random.Random, drawn: list[bytes]) -> None:
        lines = drawn + [random_message(rng) for _ in range(BATCH - DRAWN)]
        rng.shuffle(lines)
        replies = exchange(path, lines)
        assert len(replies) == len(lines)
        for reply in replies:
            assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
            if not reply["ok"]:
                assert reply["error"] in {"bad-request", "unknown-command", "busy"}, reply
                assert reply["message"] and "\n" not in reply["message"]
        sent.append(len(lines))

    one_connection()
    assert sum(sent) >= 10_000
    hello = client.request(job.pid, {"cmd": "hello"}, timeout=ANSWER_S)
    assert hello["pid"] == job.pid
    status = wait_for_more_steps(job.pid)  # and training goes on
    assert status["agent_errors"] == 0 and status["capture"]["state"] == "idle"
    assert job.poll() is None
    job.terminate()
    _out, err = job.communicate(timeout=SLOW)
    assert "Traceback" not in err and "gputop:" not in err
