"""gputop: a GPU monitor for ML training that tells you why it is slow."""

__version__ = "0.1.0"
