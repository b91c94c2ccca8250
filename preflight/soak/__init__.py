"""Soak telemetry: reading a ``preflight-soak/1`` directory and judging it.

``data`` reads, validates and writes the directory; ``analysis`` turns it into findings and
the report's ``soak`` section; ``plots`` (needs matplotlib, the ``plots`` extra) draws one PNG
per host. Plots are not imported here so that judging a soak never needs matplotlib.
"""

from .analysis import HostSoak, SoakResult, Thresholds, analyze, analyze_soak
from .data import (
    FORMAT,
    SoakData,
    SoakDataError,
    SoakMeta,
    frames_from_samples,
    read_soak,
    write_soak,
)

__all__ = [
    "FORMAT", "HostSoak", "SoakData", "SoakDataError", "SoakMeta", "SoakResult", "Thresholds",
    "analyze", "analyze_soak", "frames_from_samples", "read_soak", "write_soak",
]
