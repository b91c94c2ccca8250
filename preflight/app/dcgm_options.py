"""``preflight run``'s DCGM options, kept beside the command line rather than in it.

``--dcgm-level 1|2|3|4`` picks the ``dcgmi diag`` level (1 when not given: a plain run runs the
quick level; given, a missing DCGM is an error rather than a skip); ``--dcgm-timeout`` replaces the
level's own limit (preflight/collect/dcgm.py). Both are active-test options, refused with ``--quick``.
"""

from __future__ import annotations

import argparse

from preflight.app.errors import UsageError
from preflight.collect.dcgm import LEVEL_LIMIT_S, LEVELS, DcgmOptions
from preflight.knowledge.datafile import positive


def add(group) -> None:
    limits = ", ".join(f"{n}: {LEVEL_LIMIT_S[n]:g} s" for n in LEVELS)
    group.add_argument("--dcgm-level", type=int, choices=LEVELS, metavar="N",
                       help="DCGM diagnostics level, dcgmi diag -r N (1 quick .. 4 extended; default 1, and a "
                            "missing dcgmi then only skips)")
    group.add_argument("--dcgm-timeout", type=positive(float), metavar="SECONDS",
                       help=f"limit for dcgmi diag; a longer run is reported as hung (default per level: {limits})")


def options_of(args: argparse.Namespace) -> DcgmOptions:
    level = getattr(args, "dcgm_level", None)
    timeout = getattr(args, "dcgm_timeout", None)
    if getattr(args, "quick", False) and (level is not None or timeout is not None):
        raise UsageError("--dcgm-level/--dcgm-timeout run DCGM diagnostics, an active test: not with --quick")
    return DcgmOptions(level or 1, level is not None, timeout)
