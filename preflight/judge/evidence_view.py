"""What a fact is derived from: one host's evidence as ``preflight.judge.facts`` sees it.

``HostContext`` (preflight.judge.context) reads the fact table and is what the facts receive;
the facts are written against this protocol instead, so the table does not import the context
that reads it (the two used to import each other).
"""

from __future__ import annotations

from typing import Any, Protocol

from preflight.knowledge.profiles import Profile
from preflight.model import HostHistory, ProbeResult


class HostEvidence(Protocol):
    """A host's probe results, its profile and past, and its other facts by attribute."""

    name: str
    profile: Profile
    past: HostHistory | None

    def result(self, probe: str) -> ProbeResult | None: ...

    def text(self, probe: str) -> str: ...

    def first_text(self, *probes: str) -> tuple[str, str]: ...

    def optional(self, name: str) -> Any: ...

    def answered_by_tool(self, probe: str) -> tuple[str, ...]: ...

    def __getattr__(self, name: str) -> Any: ...  # the other facts: ``ctx.smi``, ``ctx.ib_probe``
