"""The check API under its first name; ``preflight.check`` is the public module now.

Checks written against ``from preflight.plugin import host_check, ok, ...`` keep loading, and
so do tools that loaded checks through it.
"""

from preflight.check import *  # noqa: F403
from preflight.check import __all__ as _api
from preflight.judge.loader import CheckLoadError, load_checks, load_dir, select

__all__ = [*_api, "CheckLoadError", "load_checks", "load_dir", "select"]
