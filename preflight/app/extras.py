"""The optional ``analysis`` extra (pyproject.toml): pandas, numpy and matplotlib, for a soak's
analysis and plots only.

A node install is the core package alone (healthcheck, prolog, run --local never load these
libraries); a command that needs them asks here first, so that a machine without them gets one
line naming the extra to install (exit 2) instead of a traceback, and a soak is refused before
it loads any GPU rather than failing at its end.
"""

from __future__ import annotations

import importlib

from preflight.app.errors import UsageError

EXTRA = "analysis"
MODULES = ("pandas", "numpy", "matplotlib")
INSTALL = f"pip install 'preflight-gpu[{EXTRA}]'"


def require_analysis(what: str) -> None:
    """Raise UsageError naming the extra when one of its libraries cannot be imported. Imports
    them (a second or so): only commands that go on to use them call this."""
    missing = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise UsageError(f"{what} needs {', '.join(missing)}, which a node install leaves out: "
                         f"install the [{EXTRA}] extra ({INSTALL})")
