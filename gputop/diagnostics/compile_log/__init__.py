"""torch.compile's structured logs (``TORCH_TRACE=dir``, what tlparse reads), read offline.

``read`` streams one log (bounded lines, untrusted), ``parse`` folds its records into one
rank's compiles, graph breaks and collective schedules, ``judge`` turns the ranks of a job into
findings in the live findings' ids (``recompiles``, ``graph-breaks``, ``compile-fallback``,
``desync``), ``render`` prints them. Pure Python: no torch.
"""
