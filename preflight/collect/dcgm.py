"""The DCGM probes: ``dcgmi-diag`` (active, one level of ``dcgmi diag``), ``dcgmi-discovery`` and
``dcgmi-health``.

``dcgmi-diag`` is ``sh -c SCRIPT sh LEVEL ASKED LIMIT`` (``scripts/dcgmi_diag.sh``): the run's
options as positional parameters, never pasted into shell text. The script prints a header line
``# preflight: dcgmi-diag level=N asked=0|1 limit=S``, runs ``dcgmi diag -r N -j`` under
``timeout`` at the level's own limit, and closes with ``# preflight: dcgmi-diag exit=C seconds=S``
(124 or 137: the diagnostic did not finish, and that is the result). It exits 127 when dcgmi is
absent and 0 otherwise, whatever dcgmi did: the closing line says that. ``asked`` records whether
the user chose the level (``--dcgm-level``), so the check can tell "DCGM not installed, fine" from
"DCGM asked for and missing".

``dcgmi-health`` is a fixed ``sh -c`` script (``scripts/dcgmi_health.sh``): ``dcgmi health -s a``
then ``dcgmi health -c -j``, each followed by ``# preflight: dcgmi-health set|check exit=C``; it
exits 127 when dcgmi is absent. It is static: setting the watches and reading what the host
engine kept takes a second and loads nothing, unlike the diagnostic.

Limits per level: NVIDIA's dcgmi diag reference gives the normal durations (level 1 seconds,
2 about two minutes, 3 about 15 minutes, 4 longer: 1-2 hours on Blackwell); each limit is several
times that, so a slow but healthy run finishes and a hung one is stopped (docs/sources.md, DCGM).
"""

from __future__ import annotations

from dataclasses import dataclass

from preflight.collect import scripts
from preflight.collect.probe import Probe

PROBE_ID = "dcgmi-diag"
DISCOVERY_PROBE_ID = "dcgmi-discovery"
HEALTH_PROBE_ID = "dcgmi-health"
LEVELS = (1, 2, 3, 4)
LEVEL_LIMIT_S = {1: 300.0, 2: 1200.0, 3: 3600.0, 4: 3 * 3600.0}
KILL_AFTER_S = 30  # dcgmi gets this long after SIGTERM to stop the diagnostic before SIGKILL
SLACK_S = 30  # the shell around it
SCRIPT = scripts.read("dcgmi_diag.sh").replace("@KILL_AFTER@", str(KILL_AFTER_S))


@dataclass(frozen=True)
class DcgmOptions:
    level: int = 1
    asked: bool = False  # True when the user chose the level (--dcgm-level)
    timeout_s: float | None = None  # None: the level's own limit

    def limit(self) -> float:
        return self.timeout_s if self.timeout_s is not None else LEVEL_LIMIT_S[self.level]


def arguments(options: DcgmOptions) -> tuple[tuple[str, ...], float]:
    if options.level not in LEVELS:
        raise ValueError(f"DCGM diagnostic level must be one of {LEVELS}, not {options.level}")
    return ((str(options.level), "1" if options.asked else "0", f"{options.limit():g}"),
            options.limit() + KILL_AFTER_S + SLACK_S)


PROBE = Probe(PROBE_ID, ("sh", "-c", SCRIPT, "sh"), "DCGM diagnostics, dcgmi diag -r LEVEL -j (active)",
              "dcgmi", active=True, options=DcgmOptions, arguments=arguments)
DISCOVERY = Probe(DISCOVERY_PROBE_ID, ("dcgmi", "discovery", "-l"), "GPUs DCGM's host engine sees", "dcgmi")
HEALTH = Probe(HEALTH_PROBE_ID, ("sh", "-c", scripts.read("dcgmi_health.sh")),
               "DCGM background health watches: dcgmi health -s a, then -c -j", "dcgmi")


def asked_level(command: tuple[str, ...]) -> tuple[int | None, bool]:
    """(level, asked) from a recorded dcgmi-diag command; (None, False) for another command."""
    if len(command) >= 7 and command[:2] == ("sh", "-c") and command[3] == "sh":
        try:
            return int(command[4]), command[5] == "1"
        except ValueError:
            pass
    return None, False
