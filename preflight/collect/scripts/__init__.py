"""Shell scripts the probes run on nodes as ``sh -c SCRIPT sh ARG...``, kept as files here and
read with ``importlib.resources``, never imported. Options reach a script only as positional
parameters, never pasted into its text, so no host name or option can inject shell.
"""

from __future__ import annotations

from importlib.resources import files


def read(name: str) -> str:
    """The script ``name`` (e.g. ``kernel_log.sh``) as the text ``sh -c`` runs."""
    return files(__name__).joinpath(name).read_text().rstrip("\n")
