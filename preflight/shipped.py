"""Where the data folders that ship with the code live: ``checks/`` and ``playbooks/``.

In the repository they sit at the top level, beside ``preflight/``, as the project was laid out;
a wheel maps them into the package (``preflight/builtin_checks``, ``preflight/playbooks``, see
``[tool.setuptools.package-dir]`` in pyproject.toml) as real files, since an installed package
has no top level of its own. Both places are looked up here and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _folder(installed: str, top_level: str) -> Path:
    inside = _PACKAGE / installed
    return inside if inside.is_dir() else _PACKAGE.parent / top_level


def checks_dir() -> Path:
    """The built-in checks."""
    return _folder("builtin_checks", "checks")


def playbooks_dir() -> Path:
    """Profiles, causes, rules, the Xid catalog and the NIC firmware matrix (YAML)."""
    return _folder("playbooks", "playbooks")
