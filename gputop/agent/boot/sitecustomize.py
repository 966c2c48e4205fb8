"""Loaded by every Python process of a job started with ``gputop run``.

``gputop run`` puts this directory first on PYTHONPATH, so Python's ``site`` imports this file as
``sitecustomize``. It first runs the sitecustomize that would have run without us (the next one
on sys.path, if any), then loads the gputop agent. Whatever goes wrong here is reported in one
line and the program runs on: the agent is never worth a failed job.
"""

import os
import sys


def _chain_to_next_sitecustomize(here):
    """Import the sitecustomize that we shadow, as if we were not there."""
    ours = sys.modules.pop("sitecustomize", None)
    # We are done with this directory; the environment still carries it to child processes.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401  (the next one on the path)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _load_gputop(package_dir):
    """Import gputop from the tree this file belongs to, even if the job's Python lacks it."""
    if "gputop" in sys.modules:
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gputop",
        os.path.join(package_dir, "__init__.py"),
        submodule_search_locations=[package_dir],
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["gputop"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["gputop"]
        raise


def _is_gputop_itself():
    """The gputop CLI, run inside a job, is not a training process."""
    argv = list(getattr(sys, "orig_argv", None) or [])
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] == "gputop":
        return True
    return len(argv) >= 2 and os.path.basename(argv[1]) == "gputop"


def _boot():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        _chain_to_next_sitecustomize(here)
    except Exception as exc:
        print(f"gputop: the job's own sitecustomize failed: {exc!r}", file=sys.stderr)
    if os.environ.get("GPUTOP_AGENT", "1") == "0" or _is_gputop_itself():
        return
    try:
        if sys.version_info < (3, 10):  # noqa: UP036  (the job may use an older Python)
            raise RuntimeError("the agent needs Python 3.10 or newer")
        _load_gputop(os.path.dirname(os.path.dirname(here)))  # gputop/agent/boot -> gputop
        import gputop.agent

        gputop.agent.install()
        problem = gputop.agent.problem()
        if problem:
            raise RuntimeError(problem)
    except Exception as exc:
        print(f"gputop: agent not loaded in pid {os.getpid()}: {exc}", file=sys.stderr)


_boot()
