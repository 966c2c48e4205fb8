"""The demo: real stand-in processes for the simulated GPUs (see standin.py and standins.py)."""
