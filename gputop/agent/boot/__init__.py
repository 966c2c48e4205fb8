"""The directory `gputop run` puts first on PYTHONPATH; it holds only a sitecustomize."""
