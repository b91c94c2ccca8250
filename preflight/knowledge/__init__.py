"""Loaders for what the project knows, kept as YAML in ``playbooks/``: platform profiles, the
ConnectX firmware matrix, the Xid catalog, and the shared YAML reader with file:line errors.
Pure functions of files; no host is touched. May import: ``preflight.model``,
``preflight.parse`` (version records).
"""
