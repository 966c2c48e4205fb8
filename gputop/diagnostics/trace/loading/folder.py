"""Which files of a folder are traces: what ``gputop analyze DIR`` and ``gputop.api.analyze``
read from a folder."""

from __future__ import annotations

import os

from gputop.core.errors import UsageError


def traces_in(folder: str) -> list[str]:
    """The traces in ``folder``, by name: tensorboard_trace_handler's ``*.pt.trace.json[.gz]``
    when there are any, else every ``*.json[.gz]`` (export_chrome_trace files). Not recursive:
    a folder of runs is named one run at a time, as `tensorboard --logdir` shows them apart."""
    try:
        names = sorted(e.name for e in os.scandir(folder)
                       if not e.name.startswith(".") and e.is_file())
    except OSError as exc:
        raise UsageError(f"{folder}: cannot list the folder: {exc.strerror or exc}",
                         exit_code=2) from None
    for suffixes in ((".pt.trace.json", ".pt.trace.json.gz"), (".json", ".json.gz")):
        found = [os.path.join(folder, n) for n in names if n.endswith(suffixes)]
        if found:
            return found
    return []
