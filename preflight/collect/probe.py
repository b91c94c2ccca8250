"""A probe: one command run on a node, its stdout saved verbatim in the bundle under its id.

Commands are argv tuples. A parametrised probe (the nccl all_reduce; later DCGM diag or
ib_write_bw) names a dataclass of run options and a function from those options to the
arguments appended to its argv and its time limit; ``configured`` applies them, the options'
defaults when a run gives none. For ``sh -c SCRIPT sh ARG...`` probes the arguments reach the
script as positional parameters, never pasted into its text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Probe:
    id: str
    argv: tuple[str, ...]
    description: str
    tool: str  # the program whose absence means "tool-missing"; the one a timeout of this probe blames
    # Every other program the command calls that can hang on a sick node. A tool that hung on the
    # node earlier in the run (one of its probes timed out) passes over every later probe that
    # names it here or as ``tool``: a script that would only wait for it again costs no second
    # timeout (the all_reduce probe counts GPUs with nvidia-smi before it starts).
    calls: tuple[str, ...] = ()
    timeout_s: float | None = None  # None: the run's --timeout
    # A slow tool's limit as a multiple of --timeout, so --timeout still bounds it (mlxfwmanager
    # queries every adapter's flash: 4 x the default 30 s is the 120 s it used to have fixed).
    timeout_factor: float | None = None
    active: bool = False  # loads the node (a benchmark); `run --quick` leaves its checks out
    # A second reading taken after the active probes (IB error counters: what grew under load);
    # a run without active probes leaves it out.
    after_active: bool = False
    options: type | None = None  # a parametrised probe's options (a dataclass with defaults)
    arguments: Callable[[Any], tuple[tuple[str, ...], float | None]] | None = None

    @property
    def tools(self) -> tuple[str, ...]:
        """Every program the probe needs: its own tool first, then the ones its script calls."""
        return (self.tool, *(t for t in self.calls if t != self.tool))

    def configured(self, options: Any = None) -> Probe:
        """This probe with a run's options applied (their defaults when None)."""
        if self.arguments is None:
            return self
        args, limit = self.arguments(options if options is not None else self.options())
        return replace(self, argv=self.argv + tuple(args), timeout_s=limit)
