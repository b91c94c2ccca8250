"""Fabric acceptance planning: pure code that decides which runs to launch (no I/O)."""
