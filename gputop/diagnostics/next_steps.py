"""The commands findings print as their next step, built from one table of documented flags.

Every command must run as printed on the tool's current command line, so each is assembled
here from flags checked against the tool's documentation (``DOCUMENTED``, with its source), and
``tests/test_next_steps.py`` checks every next step gputop prints against the table and runs
gputop's own.

Facts that shape them:

- Nsight Systems and Nsight Compute cannot attach to a running process: the job is launched
  under them (``nsys profile [options] <app> [args]``). gputop itself can (``gputop capture``
  through the agent), and so can py-spy (``py-spy dump --pid``).
- A trace with no GPU in it (a CPU-only run) gets no GPU profiler: ``host_profile`` (py-spy
  with native frames) stands where ``nsys``/``rocprofv3`` would.
- ``nsys --sample`` takes ``process-tree|system-wide|none`` (the old ``cpu`` is no longer
  documented); ``--cudabacktrace`` and ``--python-backtrace=cuda`` need CPU sampling, and
  ``--python-backtrace=cuda`` needs ``--cudabacktrace``.
- rocprofv3 needs ``--`` before the application.
- py-spy ``record`` takes ``--duration``/``--rate``/``--idle``, ``dump`` does not;
  ``--format chrometrace`` needs py-spy 0.4, so the default (flamegraph) is used.

Where the training command is unknown (``gputop analyze`` on a file) the placeholder ``APP``
stands for it and the README says so; where it is known (a live process, a capture), the real
command line is used.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

APP = "python train.py"

# tool -> subcommand -> {flag: allowed values (None: any value, "": a switch)}; the sources are
# the tools' current documentation (Nsight Systems User Guide "CLI Profile/Analyze/Stats Command
# Switch Options", Nsight Compute CLI 2026.1, rocprofv3 --help / rocprofiler-sdk rocprofv3.py,
# py-spy 0.3.14 and 0.4 --help).
DOCUMENTED: dict[str, dict[str, dict[str, frozenset[str] | None | str]]] = {
    # procps's ps (who else uses the CPUs): every process, the columns named, sorted.
    "ps": {"": {"-e": "", "-o": None, "--sort": None}},
    "nsys": {
        "profile": {
            "--trace": frozenset({"cuda", "nvtx", "osrt", "cudnn", "cublas", "nccl", "mpi",
                                  "ucx", "python-gil", "none"}),
            "--sample": frozenset({"process-tree", "system-wide", "none"}),
            "--python-sampling": frozenset({"true", "false"}),
            "--python-backtrace": frozenset({"cuda", "none"}),
            "--cudabacktrace": frozenset({"all", "none", "kernel", "memory", "sync", "other"}),
            "--cuda-graph-trace": frozenset({"graph", "node"}),
            "--cuda-memory-usage": frozenset({"true", "false"}),
            "--capture-range": frozenset({"none", "cudaProfilerApi", "hotkey", "nvtx"}),
            "--duration": None,
            "--kill": frozenset({"none", "sigkill", "sigterm"}),
            "--output": None,
        },
        "analyze": {"-r": frozenset({"cuda_memcpy_async", "cuda_memcpy_sync",
                                         "cuda_memset_sync", "cuda_api_sync", "gpu_gaps",
                                         "gpu_time_util", "all"})},
        "stats": {"--report": frozenset({"cuda_api_sum", "cuda_gpu_kern_sum",
                                          "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum",
                                          "cuda_gpu_trace", "nvtx_sum", "osrt_sum"})},
    },
    "ncu": {
        "": {"--kernel-name": None, "--launch-skip": None, "--launch-count": None,
             "--set": frozenset({"basic", "detailed", "full", "roofline"}), "--export": None,
             "--target-processes": frozenset({"all", "application-only"})},
    },
    "rocprofv3": {
        "": {"--hip-trace": "", "--kernel-trace": "", "--memory-copy-trace": "",
             "--sys-trace": "", "--stats": "", "--output-directory": None,
             "--output-format": frozenset({"csv", "json", "pftrace"})},
    },
    "py-spy": {
        "dump": {"--pid": None, "--native": "", "--locals": "", "--json": "",
                 "--subprocesses": ""},
        "record": {"--pid": None, "--duration": None, "--rate": None, "--output": None,
                   "--idle": "", "--gil": "", "--subprocesses": "", "--native": "",
                   "--format": frozenset({"flamegraph", "raw", "speedscope"})},
    },
    "nvidia-smi": {
        "": {"-q": "", "-d": frozenset({"PERFORMANCE", "POWER", "TEMPERATURE", "ECC",
                                        "ROW_REMAPPER", "PAGE_RETIREMENT", "CLOCK", "MEMORY"}),
             "-i": None, "--query-compute-apps": None, "--format": frozenset({"csv"})},
    },
}


def app_of(cmdline: Sequence[str] | None) -> str:
    """The training command to relaunch under a profiler: the process's own command line when
    it is known, else the placeholder."""
    if not cmdline:
        return APP
    return " ".join(shlex.quote(arg) for arg in cmdline)


def nsys(out: str, *, app: str = APP, trace: str = "cuda,nvtx,osrt", sample: str | None = None,
         extra: Sequence[str] = ()) -> str:
    parts = ["nsys profile", f"--trace={trace}"]
    if sample:
        parts.append(f"--sample={sample}")
    parts.extend(extra)
    parts.append(f"--output={out}")
    parts.append(app)
    return " ".join(parts)


def nsys_sync(app: str = APP) -> str:
    """Where each host sync comes from: CUDA backtraces need CPU sampling, Python backtraces
    need CUDA backtraces."""
    return (nsys("sync", app=app, sample="process-tree",
                 extra=("--cudabacktrace=sync", "--python-backtrace=cuda"))
            + " && nsys analyze -r cuda_api_sync sync.nsys-rep")


def nsys_stats(out: str, reports: str, app: str = APP, extra: Sequence[str] = ()) -> str:
    return nsys(out, app=app, extra=extra) + f" && nsys stats --report={reports} {out}.nsys-rep"


def nsys_rule(out: str, rules: str, app: str = APP, extra: Sequence[str] = (),
              trace: str = "cuda,nvtx,osrt") -> str:
    return (nsys(out, app=app, extra=extra, trace=trace)
            + f" && nsys analyze -r {rules} {out}.nsys-rep")


def ncu_kernel(kernel: str, app: str = APP) -> str:
    return (f"ncu --kernel-name {shlex.quote(kernel)} --launch-skip 10 --launch-count 1 "
            f"--set full --export top_kernel {app}")


def rocprof(tag: str, app: str = APP) -> str:
    return (f"rocprofv3 --hip-trace --kernel-trace --memory-copy-trace --stats "
            f"--output-directory rocprof_{tag} -- {app}")


def pyspy_dump(pid: int, native: bool = False) -> str:
    return f"py-spy dump --pid {pid}" + (" --native" if native else "")


def pyspy_record(pid: int | None, out: str, seconds: int = 10, app: str = APP,
                 idle: bool = True, subprocesses: bool = True, native: bool = False) -> str:
    flags = ((" --idle" if idle else "") + (" --subprocesses" if subprocesses else "")
             + (" --native" if native else ""))
    target = f"--pid {pid} --duration {seconds}" if pid else ""
    cmd = f"py-spy record{flags} {target} --output {out}".replace("  ", " ")
    return cmd if pid else f"{cmd} -- {app}"


def host_profile(tag: str, app: str = APP, pid: int | None = None) -> str:
    """The profiler for a trace with no GPU in it (a CPU-only run): Nsight Systems and
    rocprofv3 would have no GPU to trace, so py-spy with native frames, which shows the
    operators' C++ time under the Python line that called them (it attaches to a live pid)."""
    return pyspy_record(pid, f"{tag}.svg", app=app, native=True)


def gputop_capture(pid: int | None, steps: int = 3, job: bool = False) -> str:
    """A capture of the process (``job``: of every rank of its job, aligned on one step)."""
    return f"gputop capture {'--job ' if job else ''}{pid if pid else 'PID'} --steps {steps}"


def gputop_memory(pid: int | None, steps: int = 3) -> str:
    """A memory capture of the process (`m` in the monitor): what grows, by source line."""
    return f"gputop memory {pid if pid else 'PID'} --steps {steps}"


def check_command(command: str) -> list[str]:
    """What is wrong with a printed next step, checked against ``DOCUMENTED`` (an empty list:
    nothing). ``gputop`` commands are checked by the tests against gputop's own parser."""
    problems: list[str] = []
    for part in command.split(" && "):
        for piece in part.split(" | "):
            try:
                words = shlex.split(piece)
            except ValueError as exc:
                problems.append(f"{piece!r}: {exc}")
                continue
            if not words:
                problems.append(f"empty command in {command!r}")
                continue
            problems.extend(_check_tool(words))
    return problems


# Commands a next step may use without a flag table: gputop (checked against its parser by the
# tests) and standard shell tools.
_PLAIN_TOOLS = frozenset({"gputop", "dmesg", "grep", "head"})


def _check_tool(words: list[str]) -> list[str]:
    tool, args = words[0], words[1:]
    if tool in _PLAIN_TOOLS:
        return []
    table = DOCUMENTED.get(tool)
    if table is None:
        return [f"{tool}: not a tool whose flags are documented here"]
    sub = ""
    if "" not in table:
        if not args or args[0] not in table:
            return [f"{tool}: unknown subcommand {args[:1]}"]
        sub, args = args[0], args[1:]
    flags = table[sub]
    problems = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":  # the application follows (rocprofv3, py-spy record)
            break
        if not word.startswith("-"):
            break  # the application (nsys, ncu) or a file argument
        name, eq, value = word.partition("=")
        if name not in flags:
            problems.append(f"{tool} {sub}: {name} is not a documented flag".replace("  ", " "))
            i += 1
            continue
        allowed = flags[name]
        if allowed == "":
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args):
                problems.append(f"{tool} {sub}: {name} needs a value")
                break
            value = args[i + 1]
            i += 1
        if isinstance(allowed, frozenset):
            bad = [v for v in value.split(",") if v not in allowed]
            if bad:
                problems.append(f"{tool} {sub}: {name}={value}: {', '.join(bad)} not documented")
        i += 1
    return problems
