"""The built-in checks: one module per check or family of checks.

Files whose name starts with ``_`` are helpers for the checks beside them (``from ._x import
y``); the loader does not look for checks in them.
"""
