"""Plan Explorer: inspect, search, hand-tune and run parallelization plans of PyTorch models."""

__version__ = "0.1.0"
