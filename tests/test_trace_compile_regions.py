"""`gputop analyze` on traces of compiled jobs (issue 41): the time in compiled regions and in
dynamo's guard checks, and the recompilation inside the captured steps."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import SLOW, TRACES, run_cli

# A real compiled CPU job profiled across a batch-size change: the recompile is in the window.
JOB = textwrap.dedent("""
    import sys, torch
    from torch.profiler import profile
    if hasattr(torch._dynamo.config, "automatic_dynamic_local_pgo"):
        torch._dynamo.config.automatic_dynamic_local_pgo = False
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 4)
    compiled = torch.compile(model, backend="eager", dynamic=False)
    compiled(torch.randn(8, 16)).sum().backward()
    with profile() as prof:
        for batch in (8, 8, 5, 8):
            compiled(torch.randn(batch, 16)).sum().backward()
            prof.step()
    prof.export_chrome_trace(sys.argv[1])
""")


@pytest.fixture(scope="module")
def compiled_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("compiled") / "compiled.pt.trace.json"
    subprocess.run([sys.executable, "-c", JOB, str(path)], check=True, timeout=SLOW,
                   capture_output=True)
    return path


@pytest.mark.timeout(3 * SLOW)
def test_analyze_names_compiled_regions_and_the_recompile(compiled_trace):
    result = run_cli("analyze", "--json", str(compiled_trace))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    analysis = data[0] if isinstance(data, list) else data
    compiled = analysis["metrics"]["compiled"]
    assert compiled["regions"] >= 3 and compiled["cache_lookups"] >= 3
    assert set(compiled["variants"]) >= {"0/0", "0/1"}
    assert compiled["recompilations"] == 1
    recompile = next(c for c in compiled["compilations"] if c["recompile"])
    assert recompile["compile_id"] == "0/1" and recompile["kind"] == "forward"
    text = run_cli("analyze", str(compiled_trace), env=None).stdout
    assert "torch.compile:" in text and "TorchDynamo Cache Lookup" in text
    assert "forward 0/1 (a recompile)" in text


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is absent")
def test_real_compiled_trace_shows_its_region():
    result = run_cli("analyze", "--json", str(TRACES / "tl_torch_compile_triton.json.gz"))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    compiled = (data[0] if isinstance(data, list) else data)["metrics"]["compiled"]
    assert compiled["regions"] == 1 and compiled["variants"] == ["0/0"]
    assert compiled["compiles"] == 0
