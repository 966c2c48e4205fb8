"""The trace side of the diagnosis: torch.profiler / Kineto traces loaded, measured, diagnosed.

``analysis`` is the facade (``analyze_trace``, ``compare_job``); ``load``/``stream``/``cut``
load a trace within bounds; ``steps``, ``host``, ``gaps``, ``queued``, ``busy``, ``intervals``,
``kernels``, ``links``, ``stats``, ``hta``, ``unrecorded`` measure it and ``metrics`` assembles
the measures; ``rules`` turns them into findings; ``report`` prints them; ``ranks`` compares the
ranks of one job. Pure Python: no textual, pynvml or torch.
"""
