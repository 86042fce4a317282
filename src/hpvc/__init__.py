"""hpvc: High Performance Virtual Clusters."""

__version__ = "0.1.0"
