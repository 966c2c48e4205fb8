"""The launch path inside compiled code and hooks: the Python of torch.compile's generated
wrapper (Inductor's ``call``) and of Triton's launcher between kernel launches, or of an
offloading hook between its weight copies, issues the device's work: when the GPU waits on it,
that is ``launch-bound``, not ``gpu-idle`` "host work that launches nothing".

CUDA kernels and copies cannot come from a CPU-only torch, so the traces are written in
Kineto's own schema (tests/kineto_trace.py), with with_stack frames named as CPython names them
(``path(line): function``) and the paths Inductor, Triton and diffusers use.
"""

from __future__ import annotations

import pytest

from gputop.diagnostics.trace.analysis import analyze_trace
from gputop.diagnostics.trace.measuring.host import frame_code
from tests.kineto_trace import KinetoTrace

WRAPPER = "/tmp/torchinductor_alice/q3/cq3xkzv7hbm2.py(214): call"
USER = "train.py(57): train_step"


def inductor_steps(path):
    """Each step calls the compiled model: Inductor's wrapper launches 40 Triton kernels of
    20 us through the driver (cuLaunchKernel); the wrapper and Triton's launcher spend 150 us
    of Python per launch, so the GPU waits between kernels."""
    t = KinetoTrace()
    t0 = 1000.0
    for k in range(3):
        start = t0
        user = t.python(USER, t0, 0)
        dyn = t.python("torch/_dynamo/eval_frame.py(655): _fn", t0 + 5, 0, parent=user)
        wrapper = t.python(WRAPPER, t0 + 10, 0, parent=dyn)
        t0 += 20
        for i in range(40):
            run = t.python("torch/_inductor/runtime/triton_heuristics.py(1148): run", t0, 160,
                           parent=wrapper)
            spec = t.python("triton/runtime/jit.py(325): specialize_impl", t0 + 5, 120,
                            parent=run)
            t.python("triton/knobs.py(76): __get__", t0 + 20, 90, parent=spec)
            launch = t.python("triton/backends/nvidia/driver.py(529): __call__", t0 + 140, 18,
                              parent=run)
            t.python("<built-in method launch of PyCapsule object at 0x7f2a>", t0 + 145, 10,
                     parent=launch)
            corr = t.runtime("cuLaunchKernel", t0 + 147, 6, cat="cuda_driver")
            t.kernel(corr, f"triton_poi_fused_add_mul_{i}", t0 + 158, 20)
            t0 += 160
        t0 += 20
        for ev in t.events:  # close the frames around this step
            if ev["cat"] == "python_function" and ev["dur"] == 0:
                ev["dur"] = t0 - ev["ts"]
        t.step(k + 1, start, t0 - start)
        t0 += 5
    return t.write(path)


def offload_steps(path):
    """Each step's forward runs behind diffusers' group offloading hook, which moves 16 weight
    groups to the GPU (a 40 us pinned copy each) with 200 us of its own Python between them,
    then launches the forward's kernels."""
    t = KinetoTrace()
    t0 = 1000.0
    for k in range(3):
        start = t0
        user = t.python(USER, t0, 0)
        hook = t.python("diffusers/hooks/group_offloading.py(147): onload_", t0 + 5, 0,
                        parent=user)
        t0 += 10
        for _ in range(16):
            t.python("diffusers/hooks/group_offloading.py(121): _process_tensors", t0, 200,
                     parent=hook)
            t.to_device(t0 + 200, 8 * 2**20, t0 + 240, 40)
            t0 += 240
        for ev in t.events:
            if ev["cat"] == "python_function" and ev["name"].endswith("onload_") and not ev["dur"]:
                ev["dur"] = t0 - ev["ts"]
        for i in range(20):
            t.launch(t0 + 10 * i, "void gemm_kernel<__nv_bfloat16>()", t0 + 30 + 100 * i, 95,
                     op="aten::mm")
        t0 += 2100
        for ev in t.events:
            if ev["cat"] == "python_function" and ev["dur"] == 0:
                ev["dur"] = t0 - ev["ts"]
        t.step(k + 1, start, t0 - start)
        t0 += 5
    return t.write(path)


def test_frames_are_classed_by_the_code_they_run():
    assert frame_code(WRAPPER) == "launch"
    assert frame_code("triton/backends/nvidia/driver.py(529): __call__") == "launch"
    assert frame_code("/opt/conda/lib/python3.11/site-packages/accelerate/hooks.py(354): "
                      "pre_forward") == "launch"
    # Compiling is never launching, even inside Triton's JIT or the compile wrapper.
    assert frame_code("triton/compiler/compiler.py(226): compile") == "compile"
    assert frame_code("torch/_inductor/compile_fx.py(1810): compile_fx") == "compile"
    assert frame_code(USER) == "program"
    assert frame_code("torch/nn/modules/module.py(1773): _call_impl") == "library"


@pytest.mark.parametrize("build,named", [(inductor_steps, "call (cq3xkzv7hbm2.py:214)"),
                                         (offload_steps, "_process_tensors")])
def test_python_that_issues_the_launches_is_the_launch_path(tmp_path, build, named):
    a = analyze_trace(build(tmp_path / "trace.json"))
    breakdown = a.metrics["step_breakdown"]["pct"]
    assert breakdown["launch"] > 50, breakdown
    assert breakdown["host"] < 5, breakdown
    assert a.verdict == "launch-bound", a.findings
    top = a.findings[0]
    assert named in top.evidence, top.evidence
    assert "gpu-idle" not in {f.id for f in a.findings if f.severity != "info"}
