"""The simulated NVML: a fake C library behind the real nvidia-ml-py, for the demo and tests.

``scenarios`` says how each simulated GPU behaves; ``base`` holds what the driver and its MIG
part share (handles, string writing); ``mig`` the MIG calls; ``nvml`` installs the library.
The real collectors (``gputop.collect``) never import this package.
"""
