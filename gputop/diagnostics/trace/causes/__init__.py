"""The trace rules, one module per family of causes (mirroring ``diagnostics/live/``).

``input``: the input pipeline; ``host``: the device waits on the host; ``idle``: an idle
device; ``pcie``: the host link; ``memory``: device memory; ``sharing``: communication with
other ranks; ``compute``: how the device computes; ``common``: thresholds and phrasing.
``trace.rules`` runs them all in order.
"""
