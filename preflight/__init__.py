"""preflight: GPU cluster node health checks."""

__version__ = "0.1.0"
